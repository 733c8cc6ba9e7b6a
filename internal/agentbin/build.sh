#!/bin/sh
# Builds warren-agent: the sandbox agent (../agent/agent_linux.c) and the
# container init stage (../container/init_linux.c) as one standalone static
# binary, which the daemon execs as each sandbox's PID 1. musl keeps it at
# ~55 KB with a few pages of writable data, which is most of what an idle
# sandbox costs in user memory. The output is committed (like bpf2go objects) so that plain
# `go build` works without musl; scripts/test.sh checks it is current.
# init_linux.c comes first so that its page-aligned buffers sit before the
# agent's few variables, which then share a page with musl's.
# Usage: build.sh [OUT]
set -eu
cd "$(dirname "$0")"
out=${1:-warren-agent}
command -v musl-gcc >/dev/null || { echo "build.sh: musl-gcc not found (apt-get install musl-tools)" >&2; exit 1; }
musl-gcc -static -Os -s -Wall -Werror -DWARREN_AGENT_MAIN -Wl,--build-id=none \
	-o "$out" ../container/init_linux.c ../agent/agent_linux.c
