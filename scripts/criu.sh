#!/usr/bin/env bash
# Installs CRIU >= 4.2 (criu from Debian forky) into a private prefix, for
# hibernating sandboxes (internal/container's Checkpointer, through CRIU's
# RPC interface). Debian 12's criu 3.17 fails `criu check` on these kernels,
# and trixie's 4.1 cannot dump any TCP socket on kernels >= 6.16 (it reads
# SO_PASSCRED, which they refuse on inet sockets: checkpoint-restore/criu
# #2718, fixed in 4.2), so a sandbox running a server could not hibernate.
#
#   scripts/criu.sh            install unless a usable one is there
#   scripts/criu.sh --force    download and install again
#   scripts/criu.sh --mirrors  print the mirrors it would try
#
# What it does: scripts/lib/debian-prefix.sh (signed index from the apt
# sources' mirror, every .deb checked, unpacked with dpkg-deb -x, run through
# forky's own loader and libraries); $PREFIX/bin/criu. Then it runs
# `criu check` and keeps its report in $PREFIX/CHECK.
#
# Environment: WARREN_CRIU_PREFIX (default /opt/warren/criu),
# WARREN_CRIU_SUITE (default forky), WARREN_CRIU_MIRROR (default: from the
# apt sources under WARREN_CRIU_APT_DIR, default /etc/apt),
# WARREN_CRIU_KEYRING (default the Debian archive keyring).
#
# Exits 0 when criu >= 4 is installed and `criu check` passes, non-zero
# with the reason otherwise; the reason is also kept in $PREFIX.error,
# which Warren's tests quote when they skip and its checkpoint call returns.
set -euo pipefail

PREFIX=${WARREN_CRIU_PREFIX:-/opt/warren/criu}
SUITE=${WARREN_CRIU_SUITE:-forky}
KEYRING=${WARREN_CRIU_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
APT_DIR=${WARREN_CRIU_APT_DIR:-/etc/apt}
ROOT_PKG=criu
DP_NAME=criu
DP_TOOLS=(usr/sbin/criu)
DP_MAIN=criu
# criu's closure is larger than erofs-utils' (gnutls, nftables, libnl).
DP_MAX_PKGS=60
DP_MIRROR=${WARREN_CRIU_MIRROR:-}
DP_MIRROR_VAR=WARREN_CRIU_MIRROR
MIN_VERSION=4.2
ERRFILE="$PREFIX.error"

# usable BIN: BIN --version reports CRIU >= MIN_VERSION (an older one, such
# as the 4.1 earlier releases installed, is replaced).
usable() {
  local v
  [ -x "$1" ] || return 1
  v=$("$1" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }') || return 1
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$MIN_VERSION" "$v" | sort -V | head -n1)" = "$MIN_VERSION" ]
}
usable_why() { echo "not CRIU >= $MIN_VERSION or does not run: $("$1" --version 2>&1 | head -n2 | tr '\n' ' ')"; }
installed_version() { echo "CRIU $("$1" --version 2>/dev/null | awk '/^Version:/ { print $2; exit }')"; }

# The install runs in a subshell: the library exits on success too.
(
  # shellcheck source=lib/debian-prefix.sh
  . "$(dirname "$0")/lib/debian-prefix.sh"
)
[ "${1:-}" = --mirrors ] && exit 0

# The kernel must do what CRIU needs; criu check says what it lacks.
if ! out=$("$PREFIX/bin/criu" check 2>&1); then
  printf '%s\n' "$out" >"$PREFIX/CHECK" 2>/dev/null || true
  printf '%s: criu check failed: %s\n' "$(date -u +%FT%TZ)" "$(printf '%s\n' "$out" | tail -n3 | tr '\n' ' ')" >"$ERRFILE"
  echo "criu: criu check failed:" >&2
  printf '%s\n' "$out" >&2
  exit 1
fi
printf '%s\n' "$out" >"$PREFIX/CHECK"
rm -f "$ERRFILE"
