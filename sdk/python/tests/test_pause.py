"""Pause and resume in place: a paused sandbox's processes stop where they
are and continue on resume; exec is refused while paused; by-label calls
pause and resume a whole batch with one event per sandbox."""

from __future__ import annotations

from typing import List

import pytest

import warren
from conftest import IMAGE

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.01; done"


async def test_pause_resume(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        await sb.start(COUNTER)
        r = await sb.exec("head -c 16000000 /dev/zero > /tmp/cache && sync && cat /tmp/cache >/dev/null; sleep 0.2; cat /tmp/count")
        assert r.ok, r
        res = await sb.pause(reclaim=True)
        assert res.sandbox.state == warren.SandboxState.PAUSED and sb.info.state == warren.SandboxState.PAUSED
        assert res.sandbox.paused_at_unix_ms > 0
        assert res.before.file >= 15_000_000 and res.freed_bytes >= 14_000_000, res
        with pytest.raises(warren.ConflictError, match="PAUSED"):
            await sb.exec("true")
        with pytest.raises(warren.ConflictError, match="pause needs RUNNING"):
            await sb.pause()
        info = await w.get(sb.id)
        assert info.info.state == warren.SandboxState.PAUSED
        back = await sb.resume()
        assert back.sandbox.state == warren.SandboxState.RUNNING and back.paused_ms >= 0
        r1 = int((await sb.exec("cat /tmp/count")).stdout)
        r2 = int((await sb.exec("sleep 0.3; cat /tmp/count")).stdout)
        assert r2 > r1, (r1, r2)
        with pytest.raises(warren.ConflictError, match="resume needs PAUSED"):
            await sb.resume()


async def test_pause_by_label(w: warren.AsyncWarren, labels: dict) -> None:
    batch = dict(labels, batch="pause-by-label")
    sbs = [await w.create(IMAGE, labels=batch) for _ in range(3)]
    try:
        seen: List[warren.ByLabelEvent] = []
        res = await w.pause_by_label(batch, reclaim=True, parallelism=2, progress=seen.append)
        assert res.ok and res.total == 3 and len(res.events) == 3 and len(seen) == 3
        assert {e.sandbox_id for e in res.events} == {sb.id for sb in sbs}
        assert all(e.paused is not None and e.paused.sandbox.state == warren.SandboxState.PAUSED for e in res.events)
        assert [e.completed for e in res.events] == [1, 2, 3]
        res = await w.resume_by_label(batch)
        assert res.ok and res.total == 3 and all(e.resumed is not None for e in res.events)
        for sb in sbs:
            assert (await sb.exec("echo ok")).stdout == b"ok\n"
        with pytest.raises(ValueError):
            await w.pause_by_label({})
    finally:
        for sb in sbs:
            await sb.delete(missing_ok=True)


def test_pause_resume_sync(sw: warren.Warren) -> None:
    with sw.create(IMAGE) as sb:
        res = sb.pause()
        assert res.sandbox.state == warren.SandboxState.PAUSED and res.freeze_us >= 0
        with pytest.raises(warren.ConflictError):
            sb.exec("true")
        assert sb.resume().sandbox.state == warren.SandboxState.RUNNING
        assert sb.exec("echo ok").stdout == b"ok\n"
