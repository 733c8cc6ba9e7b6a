"""Hibernate and restore: a hibernated sandbox's processes are saved to disk
and continue where they stopped once resumed; files written before are
there; calls are refused while it is hibernated; by-label calls hibernate
and restore a whole batch."""

from __future__ import annotations

import os
from typing import List, Optional

import pytest

import warren
from conftest import IMAGE

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.01; done"

pytestmark = pytest.mark.skipif(
    not os.path.exists("/opt/warren/criu/bin/criu"), reason="no CRIU >= 4 at /opt/warren/criu (scripts/criu.sh installs it)"
)


@pytest.mark.parametrize("lazy", [None, False, True])
async def test_hibernate_restore(w: warren.AsyncWarren, lazy: Optional[bool]) -> None:
    # lazy: the memory restored as the node's default says (in a user
    # namespace, the default, which restores eagerly), eagerly, lazily
    # (without one: lazy restore is not for user namespaces yet).
    extra = {} if lazy is None else {"user_namespace": False}
    async with w.create(IMAGE, **extra) as sb:
        await sb.exec("echo before > /root/f")
        await sb.start(COUNTER)
        await sb.exec("sleep 0.2")
        res = await sb.hibernate()
        assert res.sandbox.state == warren.SandboxState.HIBERNATED and sb.info.state == warren.SandboxState.HIBERNATED
        assert res.bytes > 0 and res.sandbox.checkpoint_bytes == res.bytes and res.sandbox.hibernated_at_unix_ms > 0
        assert res.before.bytes > 0
        with pytest.raises(warren.ConflictError, match="HIBERNATED"):
            await sb.exec("true")
        back = await sb.resume(lazy_pages=lazy)
        assert back.restored and back.restore_us > 0 and back.sandbox.state == warren.SandboxState.RUNNING
        if lazy is None:
            # The node's default is lazy: lazily, or a reason why not (the
            # node's vm.unprivileged_userfaultfd, for a user namespace).
            assert back.lazy_pages != bool(back.eager_reason), back
        else:
            assert back.lazy_pages == lazy and back.eager_reason == "", back
        assert (await sb.exec("cat /root/f")).stdout == b"before\n"
        r1 = int((await sb.exec("cat /tmp/count")).stdout)
        r2 = int((await sb.exec("sleep 0.3; cat /tmp/count")).stdout)
        assert r2 > r1, (r1, r2)
        procs = await sb.processes()
        assert len(procs) == 1 and procs[0].info.running, procs


async def test_hibernate_by_label(w: warren.AsyncWarren, labels: dict) -> None:
    batch = dict(labels, batch="hibernate-by-label")
    sbs = [await w.create(IMAGE, labels=batch, user_namespace=False) for _ in range(2)]
    try:
        seen: List[warren.ByLabelEvent] = []
        res = await w.hibernate_by_label(batch, progress=seen.append)
        assert res.ok and res.total == 2 and len(seen) == 2, res
        assert all(e.hibernated is not None and e.hibernated.sandbox.state == warren.SandboxState.HIBERNATED for e in res.events)
        res = await w.resume_by_label(batch)
        assert res.ok and res.total == 2 and all(e.resumed is not None and e.resumed.restored for e in res.events)
        for sb in sbs:
            assert (await sb.exec("echo ok")).stdout == b"ok\n"
    finally:
        for sb in sbs:
            await sb.delete(missing_ok=True)


async def test_fork(w: warren.AsyncWarren, labels: dict) -> None:
    async with w.create(IMAGE, labels=labels) as sb:  # forks share its id range
        await sb.exec("echo shared > /root/f")
        await sb.start(COUNTER)
        await sb.exec("sleep 0.2")
        forks = await sb.fork(3, labels={"branch": "x"})
        try:
            assert len(forks) == 3 and sb.info.state == warren.SandboxState.RUNNING
            for i, f in enumerate(forks):
                assert f.info.forked_from == sb.id and f.info.labels["branch"] == "x"
                r = await f.exec(f"cat /root/f; echo {i} > /root/mine")
                assert r.stdout == b"shared\n", r
            for i, f in enumerate(forks):
                assert (await f.exec("cat /root/mine")).stdout == f"{i}\n".encode()
                c1 = int((await f.exec("cat /tmp/count")).stdout)
                c2 = int((await f.exec("sleep 0.3; cat /tmp/count")).stdout)
                assert c2 > c1, (c1, c2)
            assert (await sb.exec("cat /root/mine 2>/dev/null || echo none")).stdout == b"none\n"
        finally:
            for f in forks:
                await f.delete(missing_ok=True)


async def test_restore(w: warren.AsyncWarren) -> None:
    # On the node that hibernated it, restore is resume; a checkpoint that
    # is not there is NotFound (the move between nodes: e2e
    # TestRestoreOnAnotherNode).
    async with w.create(IMAGE, user_namespace=False) as sb:
        await sb.exec("echo kept > /root/f")
        await sb.hibernate()
        back = await w.restore(sb.id)
        assert back.restored and back.sandbox.state == warren.SandboxState.RUNNING
        assert (await sb.exec("cat /root/f")).stdout == b"kept\n"
    with pytest.raises(warren.NotFoundError, match="nohere"):
        await w.restore("nohere")
