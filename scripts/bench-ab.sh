#!/usr/bin/env bash
# A/B of two daemon builds in one run: `warren bench create` (concurrency 1,
# no peers) and optionally `warren bench density`, alternating A and B
# (ABBA) so that the machine's drift and each run's aftermath hit both
# alike. Prints each run's numbers and
# the B/A ratio of the medians and the median of the round-by-round
# ratios (each A run next to its B run in time, so load that comes and
# goes moves both), as a table and as JSON.
#   scripts/bench-ab.sh OLD_BIN NEW_BIN [rounds=5] [n=300] [density_n=0]
set -euo pipefail
a=$1 b=$2 rounds=${3:-5} n=${4:-300} dn=${5:-0}
out=$(mktemp -d)
# quiet: wait (up to 10 minutes) until the machine was >= 85% idle over
# two seconds, so that another job's burst does not land on one side only.
quiet() {
  for _ in $(seq 300); do
    read -r _ u1 n1 s1 i1 w1 _ < /proc/stat; sleep 2; read -r _ u2 n2 s2 i2 w2 _ < /proc/stat
    busy=$(( (u2+n2+s2) - (u1+n1+s1) )); idle=$(( (i2+w2) - (i1+w1) ))
    [ $(( idle * 100 / (busy + idle + 1) )) -ge 85 ] && return
  done
}
for r in $(seq 1 "$rounds"); do
  [ "${AB_QUIET:-1}" = 1 ] && quiet
  # ABBA: the second run of a pair inherits the first's writeback and
  # reaping, so the order flips every round.
  order="a b"; [ $((r % 2)) = 0 ] && order="b a"
  for side in $order; do
    bin=$a; [ $side = b ] && bin=$b
    "$bin" bench create --n "$n" --concurrency 1 --peers=false --quiet --json >"$out/create-$side-$r.json"
    if [ "$dn" -gt 0 ]; then
      "$bin" bench density --n "$dn" --peers=false --quiet --json >"$out/density-$side-$r.json"
    fi
  done
done
python3 - "$out" "$rounds" "$dn" <<'PY'
import json, statistics, sys, os
out, rounds, dn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(kind, side, r):
    return json.load(open(os.path.join(out, f"{kind}-{side}-{r}.json")))
rows = {}
for side in "ab":
    c = [load("create", side, r)["results"][0] for r in range(1, rounds + 1)]
    rows[side] = {"create_to_first_exec_p50_ms": [x["p50_ms"] for x in c],
                  "create_p50_ms": [x["create_p50_ms"] for x in c],
                  "exec_p50_ms": [x["exec_p50_ms"] for x in c],
                  "delete_p50_ms": [x["delete_p50_ms"] for x in c],
                  "create_to_first_exec_p99_ms": [x["p99_ms"] for x in c]}
    if dn:
        d = [load("density", side, r) for r in range(1, rounds + 1)]
        rows[side]["node_kib_per_sandbox"] = [x["node_kib_per_sandbox"] for x in d]
        rows[side]["accounted_kib_per_sandbox"] = [x.get("accounted_kib_per_sandbox", 0) for x in d]
        rows[side]["cgroup_kib_per_sandbox"] = [x.get("cgroup_kib_per_sandbox") or 0 for x in d]
res = {}
print(f"{'metric':32} {'A median':>10} {'B median':>10} {'B/A':>7} {'pairs':>7}   runs A | runs B")
for k in rows["a"]:
    ma, mb = statistics.median(rows["a"][k]), statistics.median(rows["b"][k])
    pairs = [b / a for a, b in zip(rows["a"][k], rows["b"][k]) if a]
    mp = statistics.median(pairs) if pairs else 0
    res[k] = {"a": rows["a"][k], "b": rows["b"][k], "a_median": ma, "b_median": mb, "ratio": mb / ma if ma else None, "pair_ratio_median": mp}
    print(f"{k:32} {ma:10.3f} {mb:10.3f} {mb/ma if ma else 0:7.3f} {mp:7.3f}   {' '.join(f'{v:.2f}' for v in rows['a'][k])} | {' '.join(f'{v:.2f}' for v in rows['b'][k])}")
json.dump(res, open(os.path.join(out, "ab.json"), "w"), indent=1)
print("json:", os.path.join(out, "ab.json"))
PY
