# Build the warren binary. The release build is static pure Go
# (CGO_ENABLED=0): the daemon has no C of its own, the sandbox init and
# agent come prebuilt per architecture from internal/agentbin, so it runs
# on any Linux of its architecture. A plain `go build ./cmd/warren` or
# `go install github.com/warrenrl/warren/cmd/warren@latest` works too.
GO ?= go
BIN ?= bin/warren

.PHONY: build agent gen test
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/warren
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s\ -w -o $(dir $(BIN))warren-guest ./cmd/warren-guest

# Rebuild the committed sandbox agents (musl and a cross compiler: scripts/deps.sh).
agent:
	$(GO) generate ./internal/agentbin

gen:
	protoc -I api --go_out=gen --go_opt=paths=source_relative \
	  --connect-go_out=gen --connect-go_opt=paths=source_relative \
	  api/warren/v1/warren.proto
	protoc -I api --go_out=gen --go_opt=paths=source_relative \
	  --connect-go_out=gen --connect-go_opt=paths=source_relative \
	  api/e2b/process/process.proto api/e2b/filesystem/filesystem.proto

test:
	./scripts/test.sh
