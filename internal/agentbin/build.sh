#!/bin/sh
# Builds warren-agent: the sandbox agent (../agent/agent_linux.c) as a
# standalone static binary. musl keeps it at ~45 KB with a few pages of
# writable data, which is most of what an idle sandbox costs in user
# memory. The output is committed (like bpf2go objects) so that plain
# `go build` works without musl; scripts/test.sh checks it is current.
# Usage: build.sh [OUT]
set -eu
cd "$(dirname "$0")"
out=${1:-warren-agent}
command -v musl-gcc >/dev/null || { echo "build.sh: musl-gcc not found (apt-get install musl-tools)" >&2; exit 1; }
musl-gcc -static -Os -s -Wall -Werror -DWARREN_AGENT_MAIN -Wl,--build-id=none \
	-o "$out" ../agent/agent_linux.c
