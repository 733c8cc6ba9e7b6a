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
# The official E2B Python SDKs from PyPI (the newest that passes and an
# older 2.x), for test/e2e's TestE2BSDK (docs/E2B.md).
e2b_venvs=$(mktemp -d /tmp/warren-e2b-venv.XXXXXX)
trap 'rm -rf "$e2b_venvs"' EXIT
for v in "WARREN_E2B_VENV requirements.txt" "WARREN_E2B_VENV_OLD requirements-old.txt"; do
  set -- $v
  python3 -m venv "$e2b_venvs/$1"
  "$e2b_venvs/$1/bin/python" -m pip install -q --disable-pip-version-check -r "sdk/python/tests_e2b/$2"
  export "$1=$e2b_venvs/$1"
done
# And the E2B JavaScript SDK from npm, for TestE2BJSSDK.
mkdir "$e2b_venvs/js"
cp sdk/js_e2b/package.json "$e2b_venvs/js/"
(cd "$e2b_venvs/js" && npm install --silent --no-audit --no-fund)
export WARREN_E2B_JS="$e2b_venvs/js"
# The fidelity suite (test/fidelity: CPython's regression tests in a
# sandbox and in a chroot, ~5 minutes, both cores) runs on its own after
# the rest: beside the e2e suites each would slow the other into
# timeouts. WARREN_FIDELITY=skip skips it (docs/FIDELITY.md).
go test -race -count=1 -timeout 20m $(go list ./... | grep -v '/test/fidelity$')
go test -count=1 -timeout 20m -v ./test/fidelity/
# The Python SDK's tests drive the daemon binary of this tree.
make -s build
./scripts/test-python.sh
