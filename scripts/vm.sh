#!/usr/bin/env bash
# Installs what the microvm backend boots: QEMU (qemu-system-x86 from
# Debian, and qemu-utils' qemu-img, which the fullvm image is built and
# forked with) and a guest kernel, Debian's linux-image package unpacked under
# /opt/warren/vm/kernels/<release>/ (its modules and an uncompressed
# vmlinux, which QEMU boots through its PVH entry point) without touching
# the node's own /boot or its boot loader. internal/guestkernel finds it.
#
#   scripts/vm.sh            install unless present
#   scripts/vm.sh --force    download and unpack the kernel again
#
# Environment: WARREN_VM_DIR (default /opt/warren/vm), WARREN_VM_KERNEL_PKG
# (default: what linux-image-amd64 depends on).
set -euo pipefail
DIR=${WARREN_VM_DIR:-/opt/warren/vm}
force=${1:-}
[ "$(uname -m)" = x86_64 ] || { echo "vm: only x86_64 guests are built here" >&2; exit 0; }
export DEBIAN_FRONTEND=noninteractive
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
if [ ${#need[@]} -gt 0 ]; then
  echo "vm: installing ${need[*]}" >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
fi
pkg=${WARREN_VM_KERNEL_PKG:-$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')}
[ -n "$pkg" ] || { echo "vm: cannot tell which linux-image package linux-image-amd64 names (apt-get update?)" >&2; exit 1; }
release=${pkg#linux-image-}
dest="$DIR/kernels/$release"
if [ -f "$dest/vmlinux" ] && [ "$force" != --force ]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || { apt-get update -qq && (cd "$work" && apt-get download "$pkg" >/dev/null); }
dpkg-deb -x "$work"/*.deb "$work/x"
mkdir -p "$dest.tmp/lib/modules"
# bzImage -> vmlinux: the kernel is the xz stream inside (Debian's amd64
# kernels are built with CONFIG_KERNEL_XZ).
python3 - "$work/x/boot/vmlinuz-$release" "$dest.tmp/vmlinux" <<'PY'
import lzma, sys
data = open(sys.argv[1], 'rb').read()
i = data.find(b'\xfd7zXZ\x00')
if i < 0:
    sys.exit('vm: no xz stream in ' + sys.argv[1])
out = lzma.LZMADecompressor().decompress(data[i:])
if out[:4] != b'\x7fELF':
    sys.exit('vm: the xz stream in %s is not an ELF kernel' % sys.argv[1])
open(sys.argv[2], 'wb').write(out)
PY
mv "$work/x/lib/modules/$release" "$dest.tmp/lib/modules/$release"
cp "$work/x/boot/config-$release" "$dest.tmp/config"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "vm: guest kernel $release in $dest" >&2
