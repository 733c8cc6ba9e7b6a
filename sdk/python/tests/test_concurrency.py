"""Many concurrent calls from one event loop, and the batch helpers."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

import warren
from conftest import IMAGE


@pytest.mark.timeout_s(300)
async def test_1000_concurrent_execs_from_one_loop(w: warren.AsyncWarren) -> None:
    async with w.create_many(20, IMAGE, strict=True) as group:
        assert len(group) == 20 and not group.errors
        n = 1000

        async def one(i: int) -> warren.ExecResult:
            return await group[i % len(group)].exec(["echo", str(i)], timeout=120)

        results = await asyncio.gather(*(one(i) for i in range(n)))
        assert all(r.ok for r in results)
        # one session, one pool, within its limit
        session = w._t._session
        assert session is not None
        connector = session.connector
        assert connector is not None and connector.limit == w.max_connections == 512

        wrong = [(i, r) for i, r in enumerate(results) if r.text != f"{i}\n"]
        # Every output arrives, also when the daemon's pipe readers are
        # starved of CPU past the post-exit grace period.
        assert not wrong, wrong[:5]


async def test_connection_limit_queues_instead_of_failing(addr: str, labels: Dict[str, str]) -> None:
    async with warren.AsyncWarren(addr, labels=labels, max_connections=4) as w:
        async with w.create(IMAGE) as sb:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            res = await asyncio.gather(*(sb.exec("sleep 0.3") for _ in range(12)))
            assert all(r.ok for r in res)
            assert loop.time() - t0 >= 0.85  # 12 calls, 4 at a time, 0.3 s each


async def test_exec_many_collects_per_item_errors(w: warren.AsyncWarren) -> None:
    async with w.create_many(3, IMAGE) as group:
        jobs: List[Any] = [(sb, f"echo {i}") for i, sb in enumerate(group)]
        jobs.append(("no-such-sandbox", "echo never"))
        jobs.append(warren.ExecJob(group[0], "exit 3"))
        jobs.append(warren.ExecJob(group[1].id, ["sleep", "5"], timeout=0.5))
        res = await w.exec_many(jobs, concurrency=2)
        assert len(res) == 6 and not res.ok
        assert [o.value.text for o in res[:3]] == ["0\n", "1\n", "2\n"]  # type: ignore[union-attr]
        assert isinstance(res[3].error, warren.NotFoundError)
        assert res[4].ok and res[4].unwrap().exit_code == 3
        assert res[5].unwrap().timed_out
        assert [i for i, _ in res.errors] == [3]
        with pytest.raises(warren.BatchError) as ei:
            res.raise_for_errors()
        assert isinstance(ei.value.errors[0][1], warren.NotFoundError)

        out = await group.exec("hostname", concurrency=3)
        assert out.ok and [o.unwrap().text.strip() for o in out] == [sb.id for sb in group]

        async def files(sb: warren.AsyncSandbox) -> int:
            await sb.write_file("/tmp/id", sb.id)
            return len(await sb.read_text("/tmp/id"))

        sizes = await group.map(files)
        assert sizes.values == [16, 16, 16]


async def test_create_many_partial_and_strict(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    ids = ["py-many-0", "py-many-1", "Bad Id", "py-many-3"]
    async with w.create_many(4, IMAGE, ids=ids) as group:
        assert [sb.id for sb in group] == ["py-many-0", "py-many-1", "py-many-3"]
        assert [i for i, _ in group.errors] == [2]
        assert isinstance(group.errors[0][1], warren.InvalidError)
    assert await w.list(labels) == []

    with pytest.raises(warren.BatchError):
        await w.create_many(4, IMAGE, ids=ids, strict=True)
    assert await w.list(labels) == []  # strict: the successful ones are deleted too


async def test_group_is_deleted_on_exception(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    with pytest.raises(KeyError):
        async with w.create_many(5, IMAGE) as group:
            assert len(group) == 5
            raise KeyError("boom")
    assert await w.list(labels) == []
