"""Benchmark: concurrent execs of ``true`` from one asyncio process, next
to the Go SDK doing the same against the same daemon in the same run.

    python -m warren.bench --addr unix:///run/warren/warren.sock --image busybox
    python -m warren.bench --spawn-daemon          # private daemon + busybox image (root)

Each side creates ``--sandboxes`` sandboxes, runs one warm-up round, then
``--rounds`` rounds of ``--calls`` concurrent execs spread over the
sandboxes. Reported: calls/s (median round) and p50/p99 latency (all
calls), as a table and as JSON (``--json FILE``, or ``-`` for stdout), and
the ratio of Python's throughput to Go's. The Go side is
``sdk/python/bench/gobench`` run with ``go run`` from the repository
(``--go-dir``; skipped with ``--no-go`` or when go is missing)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from ._async import AsyncWarren
from .testing import LocalDaemon, find_warren_binary

__all__ = ["run_python", "run_go", "main"]


def _pct(sorted_ms: List[float], p: float) -> float:
    if not sorted_ms:
        return 0.0
    return sorted_ms[int(p * (len(sorted_ms) - 1))]


def _raise_nofile(n: int) -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard, max(soft, n)) if hard != resource.RLIM_INFINITY else max(soft, n)
        if want > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


async def run_python(
    addr: str, image: str, sandboxes: int, calls: int, rounds: int, max_connections: Optional[int] = None
) -> Dict[str, Any]:
    """The Python side: returns the report dict."""
    conns = max_connections or calls
    _raise_nofile(conns + 256)
    label = f"pybench-{os.getpid()}"
    async with AsyncWarren(addr, max_connections=conns, labels={"warren-bench": label}) as w:
        async with w.create_many(sandboxes, image, concurrency=16, strict=True) as group:
            sbs = list(group)

            async def one_call(i: int, lat: List[float], fails: List[bool]) -> None:
                t0 = time.perf_counter()
                try:
                    r = await sbs[i % len(sbs)].exec(["true"], timeout=60)
                    fails[i] = r.exit_code != 0
                except Exception:  # noqa: BLE001 - counted
                    fails[i] = True
                lat[i] = (time.perf_counter() - t0) * 1000.0

            async def one_round() -> Dict[str, Any]:
                lat = [0.0] * calls
                fails = [False] * calls
                t0 = time.perf_counter()
                await asyncio.gather(*(one_call(i, lat, fails) for i in range(calls)))
                wall = time.perf_counter() - t0
                s = sorted(lat)
                return {
                    "wall_s": wall,
                    "calls_per_s": calls / wall,
                    "p50_ms": _pct(s, 0.50),
                    "p99_ms": _pct(s, 0.99),
                    "errors": sum(fails),
                    "_lat": lat,
                }

            await one_round()  # warm-up: connections, page cache
            results = [await one_round() for _ in range(rounds)]
    all_lat = sorted(x for r in results for x in r.pop("_lat"))
    return {
        "impl": "python",
        "transport": "connect-http1",
        "calls": calls,
        "sandboxes": sandboxes,
        "max_connections": conns,
        "rounds": results,
        "calls_per_s": statistics.median(r["calls_per_s"] for r in results),
        "p50_ms": _pct(all_lat, 0.50),
        "p99_ms": _pct(all_lat, 0.99),
        "errors": sum(r["errors"] for r in results),
    }


def _find_repo(start: str) -> Optional[str]:
    d = os.path.abspath(start)
    while True:
        gm = os.path.join(d, "go.mod")
        if os.path.isfile(gm):
            with open(gm) as f:
                if "module github.com/warrenrl/warren" in f.readline():
                    return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def run_go(
    addr: str, image: str, sandboxes: int, calls: int, rounds: int, repo: str, http1: bool = False
) -> Dict[str, Any]:
    """The Go side: ``go run ./sdk/python/bench/gobench`` in ``repo``."""
    cmd = [
        "go",
        "run",
        "./sdk/python/bench/gobench",
        "-addr",
        addr,
        "-image",
        image,
        "-sandboxes",
        str(sandboxes),
        "-calls",
        str(calls),
        "-rounds",
        str(rounds),
    ]
    if http1:
        cmd.append("-http1")
    out = subprocess.run(cmd, cwd=repo, check=True, stdout=subprocess.PIPE, timeout=1800)
    rep: Dict[str, Any] = json.loads(out.stdout)
    return rep


def _table(reports: List[Dict[str, Any]]) -> str:
    head = f"{'impl':<8} {'transport':<14} {'calls':>6} {'sandboxes':>9} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r['impl']:<8} {r['transport']:<14} {r['calls']:>6} {r['sandboxes']:>9} "
            f"{r['calls_per_s']:>9.0f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['errors']:>6}"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m warren.bench", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--addr", default=os.environ.get("WARREN_ADDR"), help="daemon address (default $WARREN_ADDR)")
    ap.add_argument("--spawn-daemon", action="store_true", help="start a private daemon (root) with a busybox image")
    ap.add_argument("--warren-bin", default=None, help="warren binary for --spawn-daemon (default $WARREN_BIN or bin/warren)")
    ap.add_argument("--image", default="busybox")
    ap.add_argument("--sandboxes", type=int, default=100)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-connections", type=int, default=None, help="Python pool size (default: --calls)")
    ap.add_argument("--no-go", action="store_true", help="skip the Go side")
    ap.add_argument("--go-http1", action="store_true", help="also run the Go SDK over HTTP/1.1 (Connect), like Python")
    ap.add_argument("--go-dir", default=None, help="repository root for go run (default: found from here or the cwd)")
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
        if not addr:
            addr = "unix:///run/warren/warren.sock"

        reports: List[Dict[str, Any]] = []
        order: List[str] = []
        repo = args.go_dir or _find_repo(os.getcwd()) or _find_repo(os.path.dirname(__file__))
        go_ok = not args.no_go and shutil.which("go") is not None and repo is not None
        if not args.no_go and not go_ok:
            print("bench: skipping the Go side (no go toolchain or repository found)", file=sys.stderr)
        # Alternate the sides so neither always gets the warmer daemon.
        print(f"bench: python, {args.calls} concurrent execs x {args.rounds} rounds over {args.sandboxes} sandboxes", file=sys.stderr)
        reports.append(asyncio.run(run_python(addr, args.image, args.sandboxes, args.calls, args.rounds, args.max_connections)))
        order.append("python")
        if go_ok:
            assert repo is not None
            print("bench: go (grpc over h2c, the Go SDK's default)", file=sys.stderr)
            reports.append(run_go(addr, args.image, args.sandboxes, args.calls, args.rounds, repo))
            if args.go_http1:
                print("bench: go (connect over http/1.1)", file=sys.stderr)
                reports.append(run_go(addr, args.image, args.sandboxes, args.calls, args.rounds, repo, http1=True))
    finally:
        if daemon is not None:
            daemon.stop()

    py = reports[0]
    go = next((r for r in reports if r["impl"] == "go" and r["transport"] == "grpc-h2c"), None)
    summary: Dict[str, Any] = {
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "reports": reports,
    }
    if go:
        ratio = go["calls_per_s"] / py["calls_per_s"] if py["calls_per_s"] else float("inf")
        summary["go_over_python_throughput"] = ratio
        summary["target"] = "python within 1.5x of go's throughput"
        summary["target_met"] = ratio <= 1.5
    print(_table(reports))
    if go:
        print(
            f"\nthroughput: go / python = {summary['go_over_python_throughput']:.2f}x "
            f"(target <= 1.5x: {'met' if summary['target_met'] else 'NOT met'})"
        )
    if args.json == "-":
        print(json.dumps(summary, indent=2))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
