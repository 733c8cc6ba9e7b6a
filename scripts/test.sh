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
# The longest packages first (their CI times, e2e ~800 s down to fncall
# ~50 s): go test starts packages in the order given, two at a time on two
# cores, and e2e, listed alphabetically last, ran alone for its last ~10
# minutes.
pkgs=$(go list ./... | grep -v '/test/fidelity$')
longest=$(for p in test/e2e internal/microvm internal/fullvm internal/bench internal/daemon internal/container internal/untrusted internal/fncall; do
  echo "$pkgs" | grep -x ".*/$p"; done)
go test -race -count=1 -timeout 20m $longest $(echo "$pkgs" | grep -vxF "$longest")
# The fidelity suite (test/fidelity: CPython's regression tests in a
# sandbox and in a chroot, ~5 minutes, both cores) runs on its own after
# the rest: beside the e2e suites each would slow the other into
# timeouts. WARREN_FIDELITY=skip skips it (docs/FIDELITY.md).
go test -count=1 -timeout 20m -v ./test/fidelity/
# The Python SDK's tests drive the daemon binary of this tree.
make -s build
./scripts/test-python.sh
