#!/usr/bin/env bash
# The test command: static checks, then every Go test (unit tests with the
# race detector; the integration suites run as root against the real
# kernel), then the Python SDK's tests when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root (namespaces, mounts, cgroups)" >&2; exit 1; }

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:" >&2; echo "$unformatted" >&2; exit 1; fi
go vet ./...
# The committed standalone agents (one per architecture) must be what
# their source builds.
agent_tmp=$(mktemp -d)
./internal/agentbin/build.sh "$agent_tmp"
for arch in amd64 arm64; do
  if ! cmp -s "$agent_tmp/warren-agent-$arch" "internal/agentbin/warren-agent-$arch"; then
    rm -rf "$agent_tmp"
    echo "internal/agentbin/warren-agent-$arch is stale: run go generate ./internal/agentbin and commit it" >&2; exit 1
  fi
done
rm -rf "$agent_tmp"
export CGO_ENABLED=1
# The fidelity suite (test/fidelity: CPython's regression tests in a
# sandbox and in a chroot, ~5 minutes, both cores) runs on its own after
# the rest: beside the e2e suites each would slow the other into
# timeouts. WARREN_FIDELITY=skip skips it (docs/FIDELITY.md).
go test -race -count=1 -timeout 20m $(go list ./... | grep -v '/test/fidelity$')
go test -count=1 -timeout 20m -v ./test/fidelity/
# The Python SDK's tests drive the daemon binary of this tree.
make -s build
./scripts/test-python.sh
