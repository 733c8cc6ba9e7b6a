#!/bin/sh
# Builds warren-agent-amd64 and warren-agent-arm64: the sandbox agent
# (../agent/agent_linux.c) and the container init stage
# (../container/init_linux.c) as one standalone static binary per
# architecture, which the daemon execs as each sandbox's PID 1. musl keeps
# it at ~55 KB with a few pages of writable data, which is most of what an
# idle sandbox costs in user memory. The outputs are committed (like bpf2go
# objects) so that plain `go build` and `go install` work without musl or a
# C compiler; scripts/test.sh checks they are current.
# init_linux.c comes first so that its page-aligned buffers sit before the
# agent's few variables, which then share a page with musl's.
# Compilers: musl-gcc (musl-tools) for amd64; aarch64-linux-gnu-gcc
# (gcc-aarch64-linux-gnu) with musl-dev:arm64's specs for arm64, which
# scripts/deps.sh installs. On an arm64 host the roles swap.
# Usage: build.sh [OUTDIR]
set -eu
out=$(cd "${1:-$(dirname "$0")}" && pwd)
cd "$(dirname "$0")"
src="../container/init_linux.c ../agent/agent_linux.c"
flags="-static -Os -s -Wall -Werror -DWARREN_AGENT_MAIN -Wl,--build-id=none"
host=$(uname -m)

# cc ARCH: the command that compiles for ARCH against musl.
cc() {
	case "$1" in
	amd64) triple=x86_64-linux-gnu musl=x86_64-linux-musl m=x86_64 ;;
	arm64) triple=aarch64-linux-gnu musl=aarch64-linux-musl m=aarch64 ;;
	esac
	specs=/usr/lib/$musl/musl-gcc.specs
	[ -f "$specs" ] || { echo "build.sh: $specs not found (apt-get install musl-dev:$1, see scripts/deps.sh)" >&2; exit 1; }
	gcc=$triple-gcc
	[ "$host" = "$m" ] && ! command -v "$gcc" >/dev/null && gcc=gcc
	command -v "$gcc" >/dev/null || { echo "build.sh: $gcc not found (apt-get install gcc-$triple, see scripts/deps.sh)" >&2; exit 1; }
	echo "$gcc -specs $specs"
}

for arch in amd64 arm64; do
	compiler=$(cc $arch)
	# shellcheck disable=SC2086 # word lists on purpose
	$compiler $flags -o "$out/warren-agent-$arch" $src
done
