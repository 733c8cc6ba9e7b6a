#!/usr/bin/env bash
# Installs kubernetes-validate (PyPI; it bundles the Kubernetes OpenAPI
# schemas, so it validates offline) into a private virtualenv, for the test
# of deploy/kubernetes (deploy/kubernetes/manifests_test.go).
#
# Environment: WARREN_KUBE_VALIDATE_PREFIX (default
# /opt/warren/kubernetes-validate); the tool is $PREFIX/bin/kubernetes-validate.
set -euo pipefail
PREFIX=${WARREN_KUBE_VALIDATE_PREFIX:-/opt/warren/kubernetes-validate}
VERSION=1.37.0
if "$PREFIX/bin/kubernetes-validate" --version 2>/dev/null | grep -qF "$VERSION"; then
  exit 0
fi
py=${PYTHON:-python3}
rm -rf "$PREFIX"
mkdir -p "$(dirname "$PREFIX")"
"$py" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install -q --disable-pip-version-check "kubernetes-validate==$VERSION"
"$PREFIX/bin/kubernetes-validate" --version >/dev/null
