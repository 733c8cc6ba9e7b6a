"""UpdateSandbox: a running sandbox's limits, lifetime and labels change all
or nothing; other states refuse with a conflict naming the state."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import warren
from conftest import IMAGE


async def test_update_limits_labels_lifetime(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, cpu_millis=500, pids_max=100, labels={"drop": "1", "keep": "1"}) as sb:
        before = sb.info.expires_at_unix_ms
        info = await sb.update(
            cpu_millis=1500, pids_max=64, timeout_seconds=7200, set_labels={"add": "2"}, remove_labels=["drop", "absent"]
        )
        assert info is sb.info
        assert info.resources.cpu_millis == 1500 and info.resources.pids_max == 64
        assert info.labels["add"] == "2" and info.labels["keep"] == "1" and "drop" not in info.labels
        assert info.expires_at_unix_ms > before + 3_000_000
        # Only what is given changes; 0 lifts the CPU quota.
        info = await sb.update(cpu_millis=0)
        assert info.resources.cpu_millis == 0 and info.resources.pids_max == 64
        # The sandbox feels the pids limit.
        r = await sb.exec("for i in $(seq 80); do sleep 2 >/dev/null 2>&1 & done; echo done")
        assert b"fork" in r.stderr, r
        # Invalid: nothing changes.
        with pytest.raises(warren.InvalidError):
            await sb.update(pids_max=2, set_labels={"x": "y"})
        with pytest.raises(warren.InvalidError):
            await sb.update(set_labels={"x": "y"}, remove_labels=["x"])
        info = await sb.refresh()
        assert "x" not in info.labels and info.resources.pids_max == 64
        info = await w.update_sandbox(sb.id, memory_bytes=256 << 20)
        assert info.resources.memory_bytes == 256 << 20


def _init_pid(sandbox_id: str) -> int:
    """The host pid of the sandbox's init: pid 1 of its namespace, in a
    cgroup named after the sandbox."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/status") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
            with open(f"/proc/{p}/cgroup") as f:
                cg = f.read()
        except OSError:
            continue
        if len(nspid) == 2 and nspid[1] == "1" and f"/{sandbox_id}\n" in cg:
            return int(p)
    raise AssertionError(f"no init found for {sandbox_id}")


async def test_update_stopped_is_conflict(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        os.kill(_init_pid(sb.id), signal.SIGKILL)
        for _ in range(200):
            if (await sb.refresh()).state == warren.SandboxState.STOPPED:
                break
            await asyncio.sleep(0.05)
        assert sb.info.state == warren.SandboxState.STOPPED == warren.SandboxState.DEAD
        with pytest.raises(warren.ConflictError) as ei:
            await sb.update(pids_max=64)
        assert "is STOPPED" in str(ei.value)


def test_update_sync(sw: warren.Warren) -> None:
    with sw.create(IMAGE, pids_max=100) as sb:
        info = sb.update(pids_max=50, set_labels={"a": "b"})
        assert info.resources.pids_max == 50 and info.labels["a"] == "b"
        assert sw.update_sandbox(sb.id, remove_labels=["a"]).labels.get("a") is None
