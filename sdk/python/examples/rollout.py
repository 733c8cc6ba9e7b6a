"""A rollout of 256 concurrent sandboxes: a scripted policy edits a file,
runs the tests and gets a reward.

Each episode starts from a small buggy shell "library" (calc.sh, whose add()
subtracts) and its tests (test.sh prints "N passed, M failed"). The policy
looks at the file, proposes a patch (right or wrong at random, like a weak
model would), the environment applies it, runs the tests in the sandbox and
turns the summary into a reward (the fraction of tests passing). An episode
ends when all tests pass or after three steps.

    python examples/rollout.py --addr unix:///run/warren/warren.sock --image busybox
    python examples/rollout.py --spawn-daemon        # a private daemon (root)

Everything runs from one asyncio process over one connection pool. Every
sandbox carries the run's label, so a crashed run can be reaped with
``delete_all(labels=...)`` (done here at the end as a safety net).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

import warren

CALC = """\
# calc.sh: a tiny library under test
add() { echo $(($1 - $2)); }
mul() { echo $(($1 * $2)); }
"""

TESTS = """\
. /work/calc.sh
passed=0; failed=0
t() { if [ "$($1 $2 $3)" = "$4" ]; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAIL: $1 $2 $3 != $4"; fi; }
t add 1 2 3; t add 5 0 5; t add 0 0 0; t add 7 3 10
t mul 2 3 6; t mul 4 0 0
echo "$passed passed, $failed failed"
"""

PATCHES = [
    ("$1 - $2", "$1 + $2"),  # the fix
    ("$1 - $2", "$2 - $1"),  # plausible but wrong
    ("$1 - $2", "$1 + $2 + 1"),  # off by one
]


class ScriptedPolicy:
    """Stands in for a model: reads the code, proposes a patch."""

    def __init__(self, seed: int, skill: float = 0.5) -> None:
        self.rng = random.Random(seed)
        self.skill = skill

    def act(self, source: str) -> warren.WriteFile:
        old, new = PATCHES[0] if self.rng.random() < self.skill else self.rng.choice(PATCHES[1:])
        return warren.WriteFile("/work/calc.sh", source.replace(old, new, 1))


async def episode(w: warren.AsyncWarren, image: str, seed: int, max_steps: int) -> Dict[str, Any]:
    env = warren.AsyncSandboxEnv(
        w,
        image,
        files={"/work/calc.sh": CALC, "/work/test.sh": TESTS},
        reward=warren.CommandReward("sh /work/test.sh", parse=lambda r: warren.parse_pass_ratio(r.text), timeout=30),
        reset_observation=lambda sb: sb.read_text("/work/calc.sh"),
        # a step's observation: the file as it is now
        observe=lambda sb, action, out: sb.read_text("/work/calc.sh"),
        max_steps=max_steps,
        create_kwargs={"memory_bytes": 64 << 20, "pids_max": 64, "timeout_seconds": 600},
    )
    policy = ScriptedPolicy(seed)
    rewards: List[float] = []
    async with env:  # the sandbox is deleted at the end, whatever happens
        original, info = await env.reset(seed=seed)
        while True:
            # each attempt patches the original file (a wrong patch is undone)
            obs, reward, done, info = await env.step(policy.act(original))
            rewards.append(reward)
            if done:
                break
    return {"seed": seed, "steps": len(rewards), "reward": rewards[-1], "solved": info["terminated"]}


async def rollout(addr: Optional[str], image: str, n: int, concurrency: int, max_steps: int) -> int:
    run = {"rollout": uuid.uuid4().hex[:12]}
    async with warren.AsyncWarren(addr, labels=run, max_connections=max(64, concurrency * 2)) as w:
        t0 = time.perf_counter()
        try:
            res = await w.map(lambda s: episode(w, image, s, max_steps), range(n), concurrency=concurrency)
        finally:
            leftovers = await w.delete_all(run)  # orphan clean-up; normally nothing is left
        wall = time.perf_counter() - t0

    done = [o.value for o in res if o.ok and o.value is not None]
    for i, err in res.errors[:5]:
        print(f"episode {i} failed: {type(err).__name__}: {err}", file=sys.stderr)
    rewards = [d["reward"] for d in done]
    steps = sum(d["steps"] for d in done)
    print(f"episodes        {len(done)}/{n} ok ({len(res.errors)} failed), {concurrency} at a time")
    if rewards:
        print(f"mean reward     {statistics.mean(rewards):.3f}")
        print(f"solved          {sum(d['solved'] for d in done)}/{len(done)}")
    print(f"steps           {steps} ({steps / wall:.0f}/s)")
    print(f"wall time       {wall:.1f}s ({len(done) / wall:.1f} episodes/s)")
    print(f"left behind     {len(leftovers)} sandboxes")
    return 0 if not res.errors and not leftovers else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--addr", default=os.environ.get("WARREN_ADDR"))
    ap.add_argument("--image", default="busybox")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=256, help="sandboxes alive at once")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--spawn-daemon", action="store_true", help="start a private daemon with a busybox image (root)")
    args = ap.parse_args()
    daemon = None
    if args.spawn_daemon:
        from warren.testing import LocalDaemon, find_warren_binary

        binary = find_warren_binary(os.getcwd()) or find_warren_binary()
        if not binary:
            ap.error("no warren binary: run `make build` or set WARREN_BIN")
        daemon = LocalDaemon(binary).start()
        daemon.build_busybox_image(args.image)
        args.addr = daemon.addr
    try:
        return asyncio.run(rollout(args.addr, args.image, args.episodes, args.concurrency, args.max_steps))
    finally:
        if daemon is not None:
            daemon.stop()


if __name__ == "__main__":
    sys.exit(main())
