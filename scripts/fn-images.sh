#!/usr/bin/env bash
# Builds the root filesystems of the fncall backend's language images from
# this host's own programs and packages (Debian's), so that the tests and
# `warren bench fncall` need no registry and never skip:
#
#   python  the host's /usr/bin/python3 with its standard library (the
#           compiled .pyc files included: a job cannot write them, and
#           without them every start recompiles; no tkinter, idlelib or
#           test suites) and lib-dynload
#   cc      the host's gcc (the driver, cc1, collect2, the LTO plugin,
#           crt files, libgcc, its own headers), binutils' as and ld, the
#           C library's headers and link files (libc6-dev, its shared
#           libraries from libc6) and the kernel's headers (linux-libc-dev)
#
# Both get busybox (sh and the usual tools) and every copied program's
# shared libraries (ldd). Then import them with the image tools:
#
#   scripts/fn-images.sh python /tmp/fn-python && warren image import fn-python /tmp/fn-python
#   scripts/fn-images.sh cc /tmp/fn-cc && warren image import fn-cc /tmp/fn-cc
#   warren bench fncall --python-image fn-python --cc-image fn-cc
#
# (`warren bench fncall` also takes the directories themselves and imports
# them into its daemon.) The e2e tests build their images with this script.
# Usage: scripts/fn-images.sh python|cc DIR   (DIR must not exist)
set -euo pipefail

usage() { echo "usage: $0 python|cc DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
kind=$1
root=$2
[ -e "$root" ] && { echo "$0: $root exists" >&2; exit 1; }

# copy FILE...: each file (symlinks followed) at the same path under root,
# in real directories (on a merged-/usr host /lib is a symlink; cp
# --parents would copy it as one). tar: one process for many files.
copy() {
	local f
	for f in "$@"; do
		if [ -f "$f" ]; then printf '%s\n' "${f#/}"; fi
	done | tar -C / -chf - --no-recursion -T - | tar -C "$root" -xf -
}

# copytree DIR: a directory as it is (symlinks kept), at its path.
copytree() {
	mkdir -p "$root$(dirname "$1")"
	cp -a "$1" "$root$1"
}

# libs FILE...: the shared libraries (and loader) each ELF file needs.
libs() {
	local f
	for f in "$@"; do
		# shellcheck disable=SC2046 # one path per word
		copy $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true)
	done
}

# prog FILE...: programs with their libraries.
prog() {
	copy "$@"
	libs "$@"
}

base() {
	local bb
	bb=$(command -v busybox) || { echo "$0: no busybox on this host (apt-get install busybox-static)" >&2; exit 1; }
	mkdir -p "$root"/{bin,etc,tmp,var/tmp,root,proc,sys,dev,usr/bin}
	chmod 1777 "$root/tmp" "$root/var/tmp"
	cp "$bb" "$root/bin/busybox"
	libs "$bb"
	for a in $("$bb" --list); do
		[ "$a" = busybox ] || ln -s busybox "$root/bin/$a"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
}

python_image() {
	local py stdlib
	py=$(readlink -f /usr/bin/python3) || { echo "$0: no /usr/bin/python3 (apt-get install python3)" >&2; exit 1; }
	prog "$py"
	ln -sf "$(basename "$py")" "$root/usr/bin/python3"
	stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
	copytree "$stdlib"
	rm -rf "$root$stdlib"/{test,idlelib,tkinter,turtledemo,ensurepip,lib2to3/tests} "$root$stdlib"/config-*
	# Debian's sitecustomize is a symlink into /etc.
	if [ -d "/etc/$(basename "$stdlib")" ]; then copytree "/etc/$(basename "$stdlib")"; fi
	libs "$root$stdlib"/lib-dynload/*.so
	# A smoke test with the image's own files: the standard library and
	# the extension modules a judge's solution most often imports.
	chroot "$root" /usr/bin/python3 -c 'import json, re, math, collections, itertools, heapq, bisect, decimal, fractions, random, hashlib' ||
		{ echo "$0: python3 does not start in $root" >&2; exit 1; }
}

cc_image() {
	local gcc libdir f
	gcc=$(command -v gcc) || { echo "$0: no gcc on this host (apt-get install gcc)" >&2; exit 1; }
	prog "$(readlink -f "$gcc")"
	cp -L "$gcc" "$root/usr/bin/gcc"
	ln -s gcc "$root/usr/bin/cc"
	libdir=$(dirname "$(gcc -print-libgcc-file-name)")
	prog "$libdir"/{cc1,collect2,lto-wrapper,liblto_plugin.so}
	copy "$libdir"/*.o "$libdir"/libgcc.a "$libdir"/libgcc_eh.a "$libdir"/libgcc_s.so
	copytree "$libdir/include"
	for f in as ld; do
		prog "$(readlink -f "$(command -v "$f")")"
		cp -L "$(command -v "$f")" "$root/usr/bin/$f"
	done
	# shellcheck disable=SC2046 # one path per word
	copy $(dpkg -L libc6-dev linux-libc-dev libc6 libgcc-s1 | grep -v '^/usr/share/')
	# A smoke test: compile and run a program in the image.
	printf '#include <stdio.h>\nint main(void){puts("ok");return 0;}\n' >"$root/tmp/t.c"
	[ "$(chroot "$root" /bin/sh -c 'cd /tmp && cc -O2 -o t t.c && ./t; rm -f t t.c')" = ok ] ||
		{ echo "$0: cc does not compile in $root" >&2; exit 1; }
}

base
case "$kind" in
python) python_image ;;
cc) cc_image ;;
*) usage ;;
esac
du -sh "$root" | sed "s|\$| ($kind image root)|"
