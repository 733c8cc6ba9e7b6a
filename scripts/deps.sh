#!/usr/bin/env bash
# Installs what building, testing and benchmarking Warren needs on a fresh
# Debian 12 machine. Idempotent and quick when everything is present.
set -euo pipefail
need=()
command -v busybox >/dev/null || need+=(busybox-static)
command -v gcc >/dev/null || need+=(gcc)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -f /usr/lib/aarch64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v crun >/dev/null || need+=(crun)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v ip >/dev/null || need+=(iproute2)
command -v make >/dev/null || need+=(make)
command -v musl-gcc >/dev/null || need+=(musl-tools)
command -v curl >/dev/null || need+=(curl)
command -v gpgv >/dev/null || need+=(gpgv)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if ((${#need[@]})); then
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# mkfs.erofs >= 1.8 (Debian trixie's, in a private prefix) converts layers
# with real hardlinks. Optional: without it Warren uses go-erofs and the
# tests that need it skip, quoting the reason kept in <prefix>.error.
"$(dirname "$0")/erofs-utils.sh" ||
  echo "deps: mkfs.erofs >= 1.8 not installed (see above); layers are converted with go-erofs (hardlinks stored as copies)" >&2
command -v go >/dev/null || { echo "deps: Go 1.26+ is required (https://go.dev/dl)" >&2; exit 1; }
cd "$(dirname "$0")/.."
go mod download
