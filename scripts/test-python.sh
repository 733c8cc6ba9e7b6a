#!/usr/bin/env bash
# Tests of the Python SDK (sdk/python) against a real daemon. The SDK is
# installed the way a user installs it: `pip install ./sdk/python[test]` into
# a fresh venv under a temporary directory; pytest then runs from outside the
# source tree so it imports the installed package. The daemon binary comes
# from `make build` (built here when bin/warren is missing); the tests start
# their own private daemon with it; mypy checks the SDK's types first (whole
# runs). Run as root. Extra arguments go to pytest.
#
#   PYTHON=python3.9 ./scripts/test-python.sh -k retry
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
[ "$(id -u)" = 0 ] || { echo "test-python.sh: run as root (namespaces, mounts, cgroups)" >&2; exit 1; }

# $WARREN_BIN picks another daemon binary; by default bin/warren, built when missing.
if [ -z "${WARREN_BIN:-}" ]; then
  if [ ! -x bin/warren ]; then
    echo "test-python.sh: bin/warren is missing; building it"
    make build
  fi
  WARREN_BIN="$root/bin/warren"
fi
export WARREN_BIN
command -v busybox >/dev/null || ./scripts/deps.sh   # the tests' image is built from the host's busybox

tmp=$(mktemp -d /tmp/warren-pytest.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$root/sdk/python[test]"

cd "$tmp"
# The SDK's types, as its users' type checkers see them (strict: pyproject's
# [tool.mypy]); the whole run only, not a -k selection.
if [ "$#" -eq 0 ]; then
  "$tmp/venv/bin/python" -m mypy --config-file "$root/sdk/python/pyproject.toml" "$root/sdk/python/warren"
fi
set +e
"$tmp/venv/bin/python" -m pytest -p no:cacheprovider -rfEs "$root/sdk/python/tests" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test-python.sh: pytest collected no tests" >&2
fi
exit "$rc"
