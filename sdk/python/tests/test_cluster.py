"""The cluster RPCs against the suite's one node: BatchCreate, NodeStatus
and paged List (a node serves all three, as a gateway does)."""

from __future__ import annotations

import asyncio
import os
from typing import Dict

import pytest

import warren
from conftest import IMAGE


async def test_batch_create_five(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.batch_create(5, IMAGE, labels={"batch": "five"}, env={"BATCH": "yes"}) as group:
        assert len(group) == 5, group.errors
        assert group.errors == []
        ids = {sb.id for sb in group}
        assert len(ids) == 5
        for sb in group:
            assert sb.info.state == warren.SandboxState.RUNNING
            assert sb.info.labels["batch"] == "five"
            assert sb.info.labels["pytest-test"] == labels["pytest-test"]  # the client's labels too
        listed = {sb.id for sb in await w.list(labels)}
        assert listed == ids
        r = await group[0].exec(["sh", "-c", "echo $BATCH"])
        assert r.text.strip() == "yes"
    # The context manager deleted them all.
    assert await w.list(labels) == []


def test_batch_create_sync(sw: warren.Warren, labels: Dict[str, str]) -> None:
    with sw.batch_create(2, IMAGE, memory_bytes=64 << 20) as group:
        assert len(group) == 2 and not group.errors
        assert {sb.id for sb in sw.list(labels)} == {sb.id for sb in group}
        assert all(sb.info.resources.memory_bytes == 64 << 20 for sb in group)
    assert sw.list(labels) == []


async def test_batch_create_partial_failure_is_reported(w: warren.AsyncWarren) -> None:
    # On a node every failed create is reported in the response, not as the
    # call's error: a missing image makes a group of none with two errors.
    group = await w.batch_create(2, "no-such-image-batch-test")
    assert len(group) == 0
    assert len(group.errors) == 2
    for _, e in group.errors:
        assert isinstance(e, warren.WarrenError)
        assert "no-such-image-batch-test" in str(e)
    with pytest.raises(warren.BatchError) as ei:
        await w.batch_create(2, "no-such-image-batch-test", strict=True)
    assert len(ei.value.errors) == 2


async def test_batch_create_invalid(w: warren.AsyncWarren) -> None:
    for n in (0, 1001):
        with pytest.raises(ValueError):
            await w.batch_create(n, IMAGE)


async def test_batch_create_cancelled_leaves_nothing(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    # A call given up after the daemon began making sandboxes deletes what
    # it made. Cancel as soon as the first one shows.
    task = asyncio.ensure_future(w.batch_create(40, IMAGE))
    while not await w.list(labels):
        assert not task.done(), "the batch finished before its first sandbox was listed"
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await w.list(labels) == []
    await asyncio.sleep(1.0)
    assert await w.list(labels) == []


async def test_nodes_reports_this_node(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    key = "pytest-test=" + labels["pytest-test"]
    nodes = await w.nodes()
    assert len(nodes) == 1
    n = nodes[0]
    assert isinstance(n, warren.NodeStatus)
    assert n.up and n.name
    assert n.cpu_millis == (os.cpu_count() or 0) * 1000
    assert n.memory_bytes > 0
    assert key not in n.label_counts
    async with w.create(IMAGE, cpu_millis=250):
        n = (await w.nodes())[0]
        assert n.label_counts.get(key) == 1
        assert n.sandboxes >= 1
        assert n.alloc_cpu_millis >= 250


def test_nodes_sync(sw: warren.Warren) -> None:
    nodes = sw.nodes()
    assert len(nodes) == 1 and nodes[0].up


async def test_list_page_size(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create_many(5, IMAGE, strict=True) as group:
        made = {sb.id for sb in group}
        # The daemon does cut pages of 2 (so a client that did not follow
        # next_page_token would see 2)...
        d = await w._rpc("warren.v1.SandboxService/List", {"labels": labels, "pageSize": 2})
        assert len(d["sandboxes"]) == 2 and d["nextPageToken"]
        # ...and list pages through all of them, in the unpaged order.
        whole = [sb.id for sb in await w.list(labels)]
        paged = [sb.id for sb in await w.list(labels, page_size=2)]
        assert set(paged) == made
        assert paged == whole
        assert [sb.id for sb in await w.list(labels, page_size=5)] == whole
        with pytest.raises(ValueError):
            await w.list(labels, page_size=-1)


def test_list_page_size_sync(sw: warren.Warren, labels: Dict[str, str]) -> None:
    with sw.create_many(3, IMAGE, strict=True) as group:
        assert [sb.id for sb in sw.list(labels, page_size=2)] == [sb.id for sb in sw.list(labels)]
        assert len(sw.list(labels, page_size=1)) == len(group) == 3
