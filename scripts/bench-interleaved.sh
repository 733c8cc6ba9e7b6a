#!/usr/bin/env bash
# Interleaved A/B of two daemon builds: starts both (own state, run dirs,
# cgroup parents, sockets), builds the busybox image in each, and runs
# scripts/interleaved-ab (create -> exec true -> delete, alternating A
# and B cycle by cycle). Run it as root on a quiet machine.
#   scripts/bench-interleaved.sh OLD_BIN NEW_BIN [cycles=1000]
# A_ARGS and B_ARGS add flags to each side's `warren serve`: one build
# against itself with a feature off on one side, e.g.
#   A_ARGS=--seccomp=false scripts/bench-interleaved.sh bin/warren bin/warren
set -euo pipefail
a=$1 b=$2 n=${3:-1000}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /var/tmp/warren-iab.XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
for side in a b; do
  bin=$a extra=${A_ARGS:-}; [ $side = b ] && bin=$b extra=${B_ARGS:-}
  mkdir -p "$tmp/$side/state" "$tmp/$side/run"
  "$bin" serve --state-dir "$tmp/$side/state" --run-dir "$tmp/$side/run" --cgroup-parent "warren-iab-$side" \
    --socket "$tmp/$side/w.sock" $extra >"$tmp/$side.log" 2>&1 &
  pids+=($!)
done
for side in a b; do
  bin=$a; [ $side = b ] && bin=$b
  for _ in $(seq 100); do [ -S "$tmp/$side/w.sock" ] && break; sleep 0.1; done
  "$bin" --addr "unix://$tmp/$side/w.sock" image build busybox bb >/dev/null
done
go run ./scripts/interleaved-ab -a "unix://$tmp/a/w.sock" -b "unix://$tmp/b/w.sock" -image bb -n "$n"
