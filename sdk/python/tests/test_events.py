"""Security events: what the node contained in a sandbox is listed, oldest
first, with its kind, detail and the process it concerns."""

from __future__ import annotations

import pytest

import warren
from conftest import IMAGE


async def test_events_of_contained_execs(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, memory_bytes=32 << 20) as sb:
        assert await sb.events() == []
        out = await sb.exec("head -c 5000 /dev/zero", output_limit=1000)
        slow = await sb.exec(["sleep", "10"], timeout=0.1)
        oom = await sb.exec("dd if=/dev/zero of=/dev/null bs=256M count=1")
        assert out.stdout_dropped_bytes == 4000 and slow.timed_out and oom.oom_killed
        evs = await sb.events()
        kinds = {e.kind: e for e in evs}
        assert set(kinds) == {"output_cap", "timeout", "oom_kill"}, evs
        assert kinds["output_cap"].process == f"pid {out.pid}" and "4000 bytes" in kinds["output_cap"].detail
        assert kinds["oom_kill"].count == 1 and kinds["oom_kill"].time is not None
        assert [e.seq for e in evs] == [1, 2, 3]
    with pytest.raises(warren.NotFoundError):
        await sb.events()


def test_events_sync(sw: warren.Warren) -> None:
    with sw.create(IMAGE) as sb:
        sb.exec("head -c 10 /dev/zero", output_limit=1)
        evs = sb.events()
        assert len(evs) == 1 and evs[0].kind == "output_cap" and isinstance(evs[0], warren.SecurityEvent)
