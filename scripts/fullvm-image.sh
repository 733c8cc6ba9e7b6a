#!/usr/bin/env bash
# Builds the fullvm backend's disk image: Debian (bookworm by default) by
# debootstrap, with its kernel, systemd, extlinux as its boot loader and
# Warren's guest agent as a systemd service, in a qcow2 that each sandbox
# uses as the backing file of its own overlay. docs/FULLVM.md.
#
#   scripts/fullvm-image.sh [path/to/warren-guest]
#   scripts/fullvm-image.sh --gc     only remove old images (below)
#
# The agent defaults to bin/warren-guest (make build). Two stages, each
# cached under $WARREN_VM_DIR/images (default /opt/warren/vm/images) by
# what it is made of, so that each is built once per machine:
#   rootfs-<suite>-<key>/   debootstrap's tree (key: suite, packages, this
#                           script's rootfs stage version)
#   <suite>-<key>/          disk.qcow2, vmlinuz, initrd.img, cmdline, agent.sha256
#                           (key: the rootfs's and the agent's)
# and <suite> -> <suite>-<key> names the newest, which the daemon boots.
# Each stage is made under a .tmp name and renamed when complete: a failed
# build leaves nothing half-made. After each build (and with --gc) the
# suite's older images and trees go, except those a process holds a file
# of open: a VM's QEMU holds its image's disk.qcow2 (its overlay's
# backing file) for its life, and a fullvm create holds .gc-lock shared
# from reading the <suite> link until its QEMU has the file open.
#
# Environment: WARREN_VM_DIR, WARREN_FULLVM_SUITE (bookworm),
# WARREN_FULLVM_MIRROR (default: the node's apt sources' Debian mirror),
# WARREN_FULLVM_DISK (4G: the guest's disk; the qcow2 holds only what is
# written).
set -euo pipefail
DIR=${WARREN_VM_DIR:-/opt/warren/vm}/images
SUITE=${WARREN_FULLVM_SUITE:-bookworm}
SIZE=${WARREN_FULLVM_DISK:-4G}
ROOTFS_VERSION=3 # bump when the rootfs stage changes
IMAGE_VERSION=6  # bump when the image stage changes
PACKAGES=systemd-sysv,udev,kmod,procps,iproute2,busybox,linux-image-amd64,initramfs-tools,extlinux,syslinux-common
here=$(cd "$(dirname "$0")/.." && pwd)
gc_only=
[ "${1:-}" != --gc ] || { gc_only=1; shift; }
agent=${1:-$here/bin/warren-guest}

say() { echo "fullvm-image: $*" >&2; }
die() { say "$*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, loop devices, mounts)"
[ -n "$gc_only" ] || [ -x "$agent" ] || die "no guest agent at $agent (make build)"
if [ -z "$gc_only" ]; then
  export DEBIAN_FRONTEND=noninteractive
  for p in debootstrap:debootstrap qemu-img:qemu-utils; do
    command -v ${p%%:*} >/dev/null && continue
    say "installing ${p#*:}"
    apt-get install -y -qq --no-install-recommends ${p#*:} >/dev/null 2>&1 ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends ${p#*:} >/dev/null; }
  done
  for c in debootstrap qemu-img losetup mkfs.ext4 python3; do
    command -v $c >/dev/null || die "needs $c (apt-get install debootstrap qemu-utils e2fsprogs)"
  done

  mirror=${WARREN_FULLVM_MIRROR:-}
  if [ -z "$mirror" ]; then
    # The first Debian archive the node's apt uses (deb822 or one-line
    # sources), not the security one.
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {for (i=2;i<=NF;i++) print $i}' |
      grep -v security | head -1 || true)
    [ -n "$mirror" ] || mirror=$(awk '$1=="deb" {for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' \
      /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v security | head -1 || true)
    [ -n "$mirror" ] || die "no Debian mirror in the node's apt sources: set WARREN_FULLVM_MIRROR"
  fi
fi

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9 # one build at a time per machine

rkey=$(printf '%s\n' "$ROOTFS_VERSION" "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
rootfs=$DIR/rootfs-$SUITE-$rkey

# gc removes the suite's images other than the newest and its trees other
# than this script's, unless a process has a file under one open. Under
# both locks: the build's (no stage is being made) and .gc-lock, which
# creates hold shared while they go from the link to an open file.
gc() {
  local cur open d name
  exec 8>"$DIR/.gc-lock"
  flock 8
  cur=$(readlink "$DIR/$SUITE" 2>/dev/null || true)
  open=$(find /proc/[0-9]*/fd -lname "$DIR/*" -printf '%l\n' 2>/dev/null | sort -u || true)
  for d in "$DIR/$SUITE"-* "$DIR/rootfs-$SUITE"-*; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    name=$(basename "$d")
    case $name in "$cur" | "$(basename "$rootfs")" | *.tmp) continue ;; esac
    if grep -qF "$d/" <<<"$open"; then
      say "keeping $name: in use ($(grep -cF "$d/" <<<"$open") open files)"
      continue
    fi
    rm -rf "$d"
    say "removed $name"
  done
  exec 8>&-
}
if [ -n "$gc_only" ]; then
  gc
  exit 0
fi
asha=$(sha256sum "$agent" | cut -d' ' -f1)
ikey=$(printf '%s\n' "$IMAGE_VERSION" "$rkey" "$asha" "$SIZE" | sha256sum | cut -c1-12)
image=$DIR/$SUITE-$ikey

tmps=() mounts=() loop=
cleanup() {
  local i
  for ((i=${#mounts[@]}-1; i>=0; i--)); do umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true; done
  [ -z "$loop" ] || losetup -d "$loop" 2>/dev/null || true
  for t in "${tmps[@]}"; do rm -rf "$t"; done
}
trap cleanup EXIT
trap 'exit 1' INT TERM

t0=$(date +%s)
if [ ! -d "$rootfs" ]; then
  say "debootstrap $SUITE from $mirror into $rootfs (minutes)"
  tmps+=("$rootfs.tmp")
  rm -rf "$rootfs.tmp"
  if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs.tmp" "$mirror" 2>&1 |
    while read -r l; do case $l in I:\ Retrieving*|I:\ Validating*) ;; *) say "  $l" ;; esac; done; then
    die "debootstrap failed"
  fi
  # A TCP listener and a web server for agents' (and the conformance
  # suite's) port tests, from busybox: Debian's netcat and web servers
  # are packages of their own, and busybox's other applets stay unlinked
  # so Debian's commands are the ones on PATH.
  for a in nc httpd; do ln -s /bin/busybox "$rootfs.tmp/usr/local/bin/$a"; done
  # An initrd of the drivers the root disk needs, not of most of the
  # kernel's (36 MB): the boot loader reads it through the BIOS, and the
  # initrd's udev probes what it holds, both slow under TCG.
  echo MODULES=list >"$rootfs.tmp/etc/initramfs-tools/conf.d/warren"
  printf '%s\n' virtio_pci virtio_blk ext4 >>"$rootfs.tmp/etc/initramfs-tools/modules"
  for m in proc sys dev; do
    mount --bind "/$m" "$rootfs.tmp/$m"; mounts+=("$rootfs.tmp/$m")
  done
  chroot "$rootfs.tmp" update-initramfs -u -k all >/dev/null
  for ((i=${#mounts[@]}-1; i>=0; i--)); do umount "${mounts[i]}"; done
  mounts=()
  mv "$rootfs.tmp" "$rootfs"
  say "rootfs done in $(( $(date +%s) - t0 )) s"
else
  say "rootfs cached: $rootfs"
fi

if [ -f "$image/disk.qcow2" ]; then
  say "image cached: $image"
else
  t1=$(date +%s)
  say "image $image"
  tmps+=("$image.tmp")
  rm -rf "$image.tmp"
  mkdir -p "$image.tmp"
  raw=$image.tmp/disk.raw
  truncate -s "$SIZE" "$raw"
  mnt=$image.tmp/mnt
  mkdir "$mnt"
  kver=$(ls "$rootfs"/lib/modules | sort -V | tail -1)
  [ -n "$kver" ] || die "no kernel in $rootfs"
  # An MBR with one bootable Linux partition from 1 MiB to the end, and
  # syslinux's MBR boot code (from the guest's syslinux-common: the node
  # needs none of it).
  python3 - "$raw" "$rootfs/usr/lib/syslinux/mbr/mbr.bin" <<'PY'
import os, struct, sys
raw, mbr = sys.argv[1], open(sys.argv[2], 'rb').read()
sectors = os.path.getsize(raw) // 512
start = 2048
entry = struct.pack('<B3sB3sII', 0x80, b'\xfe\xff\xff', 0x83, b'\xfe\xff\xff', start, sectors - start)
with open(raw, 'r+b') as f:
    f.write(mbr[:440])
    f.seek(446)
    f.write(entry + b'\0' * 48 + b'\x55\xaa')
PY
  # The partition through a loop device of its own at its offset (a
  # loop's --partscan makes no partition devices on every kernel: not on
  # this one).
  bytes=$(stat -c %s "$raw")
  loop=$(losetup --find --show --offset $((2048 * 512)) --sizelimit $((bytes - 2048 * 512)) "$raw")
  part=$loop
  # No 64bit feature: syslinux reads ext4 without it for certain.
  mkfs.ext4 -q -O ^64bit -L warren-root "$part"
  uuid=$(blkid -o value -s UUID "$part" 2>/dev/null || python3 -c '
import sys,uuid; f=open(sys.argv[1],"rb"); f.seek(1024+0x68); print(uuid.UUID(bytes=f.read(16)))' "$part")
  mount "$part" "$mnt"; mounts+=("$mnt")
  say "copying the rootfs"
  cp -a "$rootfs"/. "$mnt"/
  rm -f "$mnt"/var/cache/apt/archives/*.deb # debootstrap's downloads
  install -m 0755 "$agent" "$mnt/usr/local/sbin/warren-guest"
  # PID 1 before systemd (init= below): with a disk limit the VM has a
  # disk whose serial is "upper", and the root becomes an overlay of the
  # image's root (read-only) under that disk's ext4, so that the
  # sandbox's writes fill that disk and nothing else (ENOSPC in the guest
  # past the limit); without one, systemd starts on the image's root as
  # it is. A failure here ends PID 1: the VM stops, the create fails with
  # the console's tail, and no sandbox runs without its limit.
  cat >"$mnt/usr/local/sbin/warren-root" <<'EOF'
#!/bin/sh
dev=
for d in /sys/block/vd*; do
  [ "$(cat "$d/serial" 2>/dev/null)" = upper ] && dev=/dev/${d##*/}
done
[ -n "$dev" ] || exec /sbin/init "$@"
set -e
mkdir -p /run/warren-upper
mount -t ext4 -o discard "$dev" /run/warren-upper
mkdir -p /run/warren-upper/upper /run/warren-upper/work
mount -t overlay overlay -o lowerdir=/,upperdir=/run/warren-upper/upper,workdir=/run/warren-upper/work /mnt
exec switch_root /mnt /sbin/init "$@"
EOF
  chmod 0755 "$mnt/usr/local/sbin/warren-root"
  cat >"$mnt/etc/systemd/system/warren-guest.service" <<'EOF'
[Unit]
Description=Warren guest agent (serves the host on the virtio-serial port "warren")
DefaultDependencies=no
After=systemd-udevd.service local-fs.target
Before=sysinit.target

[Service]
ExecStart=/usr/local/sbin/warren-guest --service
Restart=always
RestartSec=1
OOMScoreAdjust=-1000
# The unit's cgroup is the agent's to divide: it moves itself into a leaf
# and starts the commands in a sibling with the sandbox's memory and pids
# limits (internal/guest/servicecg_linux.go).
Delegate=yes

[Install]
WantedBy=sysinit.target
EOF
  mkdir -p "$mnt/etc/systemd/system/sysinit.target.wants"
  ln -sf ../warren-guest.service "$mnt/etc/systemd/system/sysinit.target.wants/warren-guest.service"
  # The screen: root logged in on tty1, for an agent that works by
  # screenshots and keys (the VM is the sandbox; the API's exec is root
  # already).
  mkdir -p "$mnt/etc/systemd/system/getty@tty1.service.d"
  cat >"$mnt/etc/systemd/system/getty@tty1.service.d/autologin.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear %I $TERM
EOF
  # Nothing that waits for a network or wakes up to fetch (the VM has no
  # network device).
  for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer systemd-timesyncd.service; do
    ln -sf /dev/null "$mnt/etc/systemd/system/$u"
  done
  echo warren >"$mnt/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 warren\n' >"$mnt/etc/hosts"
  # "defaults": systemd remounts / with these options, and an overlay
  # root (warren-root) takes no ext4 option; ext4's own errors behaviour
  # is in its superblock.
  echo "UUID=$uuid / ext4 defaults 0 1" >"$mnt/etc/fstab"
  tune2fs -e remount-ro "$part" >/dev/null
  # quiet: every character on the serial console is an exit to QEMU.
  # net.ifnames=0: a sandbox's network interface keeps the kernel's name,
  # eth0, as in a microVM. With udev's predictable names it would rename
  # it (enp0s5) seconds after the agent may have configured it, late in a
  # TCG boot, and fail ("already up, cannot rename") when it lost that
  # race: the name would be either.
  cmdline="root=UUID=$uuid ro quiet console=ttyS0,115200 console=tty0 net.ifnames=0 init=/usr/local/sbin/warren-root"
  mkdir -p "$mnt/boot/extlinux"
  cat >"$mnt/boot/extlinux/extlinux.conf" <<EOF
DEFAULT warren
PROMPT 0
TIMEOUT 0
LABEL warren
  LINUX /boot/vmlinuz-$kver
  INITRD /boot/initrd.img-$kver
  APPEND $cmdline
EOF
  # extlinux from the guest's own package, run in the guest's tree: it
  # finds the device under the mount through /proc and /dev.
  for m in proc dev sys; do
    mount --bind "/$m" "$mnt/$m"; mounts+=("$mnt/$m")
  done
  chroot "$mnt" extlinux --install /boot/extlinux >/dev/null
  cp "$mnt/boot/vmlinuz-$kver" "$image.tmp/vmlinuz"
  cp "$mnt/boot/initrd.img-$kver" "$image.tmp/initrd.img"
  echo "$cmdline" >"$image.tmp/cmdline"
  echo "$asha" >"$image.tmp/agent.sha256"
  # What the image can do that earlier ones could not (internal/fullvm
  # checks before it asks for it): network, its agent configures the
  # interface of the MAC address the host gave it (the op "network");
  # vsock, its agent serves a vsock device when the VM has one instead of
  # the virtio-serial port (serve --vm-transport vsock).
  printf '%s\n' disk-limit network vsock >"$image.tmp/features"
  for ((i=${#mounts[@]}-1; i>=0; i--)); do umount "${mounts[i]}"; done
  mounts=()
  losetup -d "$loop"; loop=
  # extlinux wrote the partition's start, which it reads from the device
  # (0: the loop is the partition alone), into its boot sector's FAT-style
  # "hidden sectors" field (offset 0x1c), where the boot sector finds
  # ldlinux.sys from: it is 2048.
  python3 - "$raw" <<'PY'
import struct, sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(2048 * 512 + 0x1c)
    f.write(struct.pack('<I', 2048))
PY
  say "converting to qcow2"
  qemu-img convert -f raw -O qcow2 "$raw" "$image.tmp/disk.qcow2"
  rm -f "$raw"; rmdir "$mnt"
  mv "$image.tmp" "$image"
  say "image done in $(( $(date +%s) - t1 )) s"
fi
ln -sfn "$(basename "$image")" "$DIR/$SUITE.tmp"
mv -T "$DIR/$SUITE.tmp" "$DIR/$SUITE"
say "$DIR/$SUITE -> $(basename "$image") ($(du -sh "$image/disk.qcow2" | cut -f1), total $(( $(date +%s) - t0 )) s)"
gc
