#!/usr/bin/env bash
# Installs the official E2B SDKs the E2B-compatible API is tested with
# (test/e2e/e2b_test.go, docs/E2B.md) into private prefixes: the Python SDK
# from PyPI in two virtualenvs (the newest release that passes, and an older
# 2.x: sdk/python/tests_e2b/requirements.txt, requirements-old.txt) and the
# JavaScript SDK from npm (sdk/js_e2b/package.json). Quick when they are
# there: each prefix keeps a copy of what it was installed from.
#
# Environment: WARREN_E2B_SDK_PREFIX (default /opt/warren/e2b-sdk); the
# tests find $PREFIX/py-newest, $PREFIX/py-older and $PREFIX/js.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${WARREN_E2B_SDK_PREFIX:-/opt/warren/e2b-sdk}
py=${PYTHON:-python3}
mkdir -p "$PREFIX"

# python_sdk DIR REQUIREMENTS
python_sdk() {
  local dir=$PREFIX/$1 req=sdk/python/tests_e2b/$2
  if cmp -s "$req" "$dir/installed-from" 2>/dev/null; then return 0; fi
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
  cp "$req" "$dir/installed-from"
}
python_sdk py-newest requirements.txt
python_sdk py-older requirements-old.txt

js=$PREFIX/js
if ! cmp -s sdk/js_e2b/package.json "$js/installed-from" 2>/dev/null; then
  rm -rf "$js"
  mkdir -p "$js"
  cp sdk/js_e2b/package.json "$js/"
  (cd "$js" && npm install --silent --no-audit --no-fund)
  cp sdk/js_e2b/package.json "$js/installed-from"
fi
