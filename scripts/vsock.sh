#!/usr/bin/env bash
# Installs vhost-device-vsock (rust-vmm's vhost-user vsock backend, from
# crates.io, built with cargo into a private prefix), which microVMs use for
# the agent's transport when the daemon runs with --vm-transport vsock on a
# node whose kernel has no vhost-vsock (/dev/vhost-vsock: CONFIG_VHOST_VSOCK
# is unset here). internal/microvm finds it at $PREFIX/bin.
#
#   scripts/vsock.sh            install unless present
#   scripts/vsock.sh --force    build and install again
#
# Environment: WARREN_VSOCK_PREFIX (default /opt/warren/vsock),
# WARREN_VSOCK_VERSION (default 0.3.0), CARGO (default cargo on $PATH or
# ~/.cargo/bin/cargo).
#
# Exits non-zero with the reason when it cannot install; the reason is also
# kept in $PREFIX.error, which the vsock tests quote when they skip.
set -euo pipefail
PREFIX=${WARREN_VSOCK_PREFIX:-/opt/warren/vsock}
VERSION=${WARREN_VSOCK_VERSION:-0.3.0}
bin="$PREFIX/bin/vhost-device-vsock"
fail() { echo "vsock: $*" >&2; mkdir -p "$(dirname "$PREFIX")"; echo "$*" > "$PREFIX.error"; exit 1; }
if [ -x "$bin" ] && [ "${1:-}" != --force ] && "$bin" --version 2>/dev/null | grep -q " $VERSION\$"; then
  rm -f "$PREFIX.error"
  exit 0
fi
cargo=${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}
[ -x "$cargo" ] || fail "no cargo to build vhost-device-vsock $VERSION with (rustup.rs installs one)"
echo "vsock: building vhost-device-vsock $VERSION into $PREFIX (about 2 minutes)" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# At nice 19: a CI run's other steps go first.
if ! nice -n 19 "$cargo" install --quiet --locked --force --root "$PREFIX" --version "$VERSION" vhost-device-vsock >"$log" 2>&1; then
  tail -20 "$log" >&2
  fail "cargo install vhost-device-vsock $VERSION failed: $(tail -1 "$log")"
fi
"$bin" --version >/dev/null || fail "$bin does not run"
rm -f "$PREFIX.error"
echo "vsock: $("$bin" --version) in $PREFIX/bin" >&2
