#!/usr/bin/env bash
# Installs mkfs.erofs >= 1.8 (erofs-utils from Debian trixie) into a private
# prefix, for Warren's layer converter: `mkfs.erofs --tar=f --aufs` writes
# real hardlinks, which the pure-Go converter (go-erofs) cannot. Debian 12
# ships erofs-utils 1.5, which has no --tar.
#
#   scripts/erofs-utils.sh            install unless a usable one is there
#   scripts/erofs-utils.sh --force    download and install again
#   scripts/erofs-utils.sh --mirrors  print the mirrors it would try
#
# What it does: scripts/lib/debian-prefix.sh (signed index from the apt
# sources' mirror, every .deb checked, unpacked with dpkg-deb -x, run through
# trixie's own loader and libraries); $PREFIX/bin/{mkfs,fsck,dump}.erofs.
#
# Environment: WARREN_EROFS_PREFIX (default /opt/warren/erofs-utils),
# WARREN_EROFS_SUITE (default trixie), WARREN_EROFS_MIRROR (default: from
# the apt sources under WARREN_EROFS_APT_DIR, default /etc/apt),
# WARREN_EROFS_KEYRING (default the Debian archive keyring).
#
# Exits 0 when a usable mkfs.erofs >= 1.8 is installed, non-zero with the
# reason otherwise; the reason is also kept in $PREFIX.error, which Warren's
# tests quote when they skip. Warren then converts layers with go-erofs.
set -euo pipefail

PREFIX=${WARREN_EROFS_PREFIX:-/opt/warren/erofs-utils}
SUITE=${WARREN_EROFS_SUITE:-trixie}
KEYRING=${WARREN_EROFS_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
APT_DIR=${WARREN_EROFS_APT_DIR:-/etc/apt}
ROOT_PKG=erofs-utils
DP_NAME=erofs-utils
DP_TOOLS=(usr/bin/mkfs.erofs usr/bin/fsck.erofs usr/bin/dump.erofs)
DP_MAIN=mkfs.erofs
DP_MAX_PKGS=40
DP_MIRROR=${WARREN_EROFS_MIRROR:-}
DP_MIRROR_VAR=WARREN_EROFS_MIRROR
MIN_MAJOR=1 MIN_MINOR=8
ERRFILE="$PREFIX.error"

# usable BIN: BIN --version reports erofs-utils >= 1.8.
usable() {
  local out v
  [ -x "$1" ] || return 1
  out=$("$1" --version 2>/dev/null | head -n1) || return 1
  v=$(printf '%s\n' "$out" | grep -oE '[0-9]+\.[0-9]+' | head -n1) || return 1
  [ -n "$v" ] || return 1
  local major=${v%%.*} minor=${v#*.}
  [ "$major" -gt "$MIN_MAJOR" ] || { [ "$major" -eq "$MIN_MAJOR" ] && [ "$minor" -ge "$MIN_MINOR" ]; }
}

usable_why() { echo "older than $MIN_MAJOR.$MIN_MINOR or does not run: $("$1" --version 2>&1 | head -n2 | tr '\n' ' ')"; }
installed_version() { "$1" --version 2>/dev/null | head -n1; }

# shellcheck source=lib/debian-prefix.sh
. "$(dirname "$0")/lib/debian-prefix.sh"
