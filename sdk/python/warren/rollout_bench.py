"""Benchmark: replay of a recorded rollout from Python.

    python -m warren.rollout_bench --spawn-daemon          # private daemon + busybox image (root)
    python -m warren.rollout_bench --addr unix:///run/warren/warren.sock --image busybox

Records a ``--steps``-step rollout (each step appends a line to a file),
then re-runs the same code ``--replays`` times: with the session's steps
read ahead (matching calls answered locally) and with ``read_ahead=False``
(each step a round trip to the daemon). Checks that the file has each
line once. Prints a table, or JSON with ``--json FILE`` (``-``: stdout)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from ._async import AsyncWarren
from .rollout import rollout
from .testing import LocalDaemon, find_warren_binary

__all__ = ["run", "main"]


async def run(addr: str, image: str, steps: int, replays: int) -> Dict[str, Any]:
    async with AsyncWarren(addr, labels={"warren-bench": f"rollout-{os.getpid()}"}) as w:
        async with w.create(image) as sb:

            async def loop(read_ahead: bool = True) -> Any:
                async with rollout(sb, "bench", read_ahead=read_ahead) as r:
                    for i in range(steps):
                        await sb.exec(f"echo step-{i} >> /tmp/trajectory", timeout=60)
                return r

            t0 = time.perf_counter()
            await loop()
            record_ms = (time.perf_counter() - t0) * 1000.0
            out: Dict[str, List[float]] = {"read_ahead": [], "round_trips": []}
            for _ in range(replays):
                for mode, ra in (("read_ahead", True), ("round_trips", False)):
                    t0 = time.perf_counter()
                    r = await loop(ra)
                    out[mode].append(round((time.perf_counter() - t0) * 1000.0, 2))
                    if r.replayed != steps or r.live != 0:
                        raise RuntimeError(f"{mode}: {r.replayed} replayed, {r.live} live")
            lines = (await sb.exec("wc -l < /tmp/trajectory")).text.strip()
            if lines != str(steps):
                raise RuntimeError(f"the file has {lines} lines, want {steps}")
    return {
        "benchmark": "python rollout replay",
        "steps": steps,
        "record_ms": round(record_ms, 1),
        "replay_read_ahead_ms": out["read_ahead"],
        "replay_read_ahead_median_ms": statistics.median(out["read_ahead"]),
        "replay_round_trips_ms": out["round_trips"],
        "replay_round_trips_median_ms": statistics.median(out["round_trips"]),
        "target_ms": 100,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m warren.rollout_bench", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--addr", default=os.environ.get("WARREN_ADDR"))
    ap.add_argument("--spawn-daemon", action="store_true", help="start a private daemon (root) with a busybox image")
    ap.add_argument("--warren-bin", default=None)
    ap.add_argument("--image", default="busybox")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the JSON report to FILE ('-' = stdout)")
    args = ap.parse_args(argv)
    daemon: Optional[LocalDaemon] = None
    addr = args.addr
    try:
        if args.spawn_daemon:
            binary = args.warren_bin or find_warren_binary(os.getcwd()) or find_warren_binary()
            if not binary:
                ap.error("no warren binary: build it with `make build` or give --warren-bin")
            daemon = LocalDaemon(binary).start()
            daemon.build_busybox_image(args.image)
            addr = daemon.addr
        rep = asyncio.run(run(addr or "unix:///run/warren/warren.sock", args.image, args.steps, args.replays))
    finally:
        if daemon is not None:
            daemon.stop()
    if args.json == "-":
        print(json.dumps(rep, indent=2))
    else:
        for k, v in rep.items():
            print(f"{k:32} {v}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rep, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
