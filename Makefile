# Build the warren binary. It is linked statically because its cgo part is
# the sandbox init, which is executed inside sandbox roots that have no libc.
GO ?= go
BIN ?= bin/warren
GOFLAGS_STATIC = -tags osusergo,netgo -ldflags '-linkmode external -extldflags "-static"'

.PHONY: build gen test
build:
	CGO_ENABLED=1 $(GO) build $(GOFLAGS_STATIC) -o $(BIN) ./cmd/warren

gen:
	protoc -I api --go_out=gen --go_opt=paths=source_relative \
	  --connect-go_out=gen --connect-go_opt=paths=source_relative \
	  api/warren/v1/warren.proto

test:
	./scripts/test.sh
