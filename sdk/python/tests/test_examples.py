"""The examples keep working."""

from __future__ import annotations

import asyncio
import os
import sys

import warren

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


async def test_rollout_example(addr: str, w: warren.AsyncWarren) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.dirname(os.path.dirname(warren.__file__)), env.get("PYTHONPATH", "")] if p
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        os.path.join(EXAMPLES, "rollout.py"),
        "--addr", addr, "--image", "busybox", "--episodes", "24", "--concurrency", "12",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 150)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "episodes        24/24 ok" in text and "left behind     0 sandboxes" in text, text
