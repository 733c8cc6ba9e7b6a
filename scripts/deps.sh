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
# Node and npm: the official E2B JavaScript SDK's tests (scripts/e2b-sdks.sh).
command -v npm >/dev/null || need+=(nodejs npm)
# Headless Chromium: the web UI's browser tests (test/e2e/ui_test.go) drive it
# with chromedp.
command -v chromium >/dev/null || need+=(chromium)
"${PYTHON:-python3}" -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
command -v gpgv >/dev/null || need+=(gpgv)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
# The sandbox agent is committed built for amd64 and arm64
# (internal/agentbin/build.sh): rebuilding it needs musl for both, and a
# cross compiler for the other architecture, whose musl-dev comes from
# Debian's multiarch packages.
case "$(uname -m)" in
  x86_64) other=arm64 cross=gcc-aarch64-linux-gnu cross_cc=aarch64-linux-gnu-gcc musl_dir=aarch64-linux-musl qemu=qemu-aarch64 ;;
  aarch64) other=amd64 cross=gcc-x86-64-linux-gnu cross_cc=x86_64-linux-gnu-gcc musl_dir=x86_64-linux-musl qemu=qemu-x86_64 ;;
  *) other= ;;
esac
multiarch=
if [ -n "$other" ]; then
  command -v "$cross_cc" >/dev/null || need+=("$cross")
  # The agent tests run the other architecture's agent under qemu's user
  # mode (without recommends: no binfmt handlers are registered).
  command -v "$qemu" >/dev/null || need+=(qemu-user)
  if [ ! -f "/usr/lib/$musl_dir/musl-gcc.specs" ]; then
    need+=("musl-dev:$other")
    dpkg --print-foreign-architectures | grep -qx "$other" || multiarch=$other
  fi
fi
if ((${#need[@]})); then
  echo "deps: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if [ -n "$multiarch" ]; then
    dpkg --add-architecture "$multiarch"
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# mkfs.erofs >= 1.8 (Debian trixie's, in a private prefix) converts layers
# with real hardlinks. Optional: without it Warren uses go-erofs and the
# tests that need it skip, quoting the reason kept in <prefix>.error.
"$(dirname "$0")/erofs-utils.sh" ||
  echo "deps: mkfs.erofs >= 1.8 not installed (see above); layers are converted with go-erofs (hardlinks stored as copies)" >&2
# CRIU >= 4.2 (Debian forky's, in a private prefix) hibernates sandboxes.
# Optional: without it checkpoint is refused and its tests skip, quoting the
# reason kept in <prefix>.error.
"$(dirname "$0")/criu.sh" ||
  echo "deps: CRIU >= 4.2 not installed or criu check failed (see above); sandboxes cannot be checkpointed" >&2
# QEMU and a guest kernel for the microvm backend (scripts/vm.sh). Optional:
# without them its tests skip, naming what is missing.
"$(dirname "$0")/vm.sh" ||
  echo "deps: QEMU or the guest kernel not installed (see above); microVMs cannot boot" >&2
# vhost-device-vsock, microVMs' vsock device where the kernel has no
# vhost-vsock (scripts/vsock.sh, built with cargo). Optional: without it
# --vm-transport vsock is refused and its tests skip, quoting the reason kept
# in <prefix>.error.
"$(dirname "$0")/vsock.sh" ||
  echo "deps: vhost-device-vsock not installed (see above); microVMs reach their agent over virtio-serial only" >&2
# kubernetes-validate (PyPI, in a private virtualenv) checks the manifests
# under deploy/kubernetes against the Kubernetes schemas.
"$(dirname "$0")/kubernetes-validate.sh"
# The official E2B SDKs (Python from PyPI, JavaScript from npm, in private
# prefixes) that test/e2e's E2B tests drive Warren's E2B API with.
"$(dirname "$0")/e2b-sdks.sh"
command -v go >/dev/null || { echo "deps: Go 1.26+ is required (https://go.dev/dl)" >&2; exit 1; }
cd "$(dirname "$0")/.."
go mod download
