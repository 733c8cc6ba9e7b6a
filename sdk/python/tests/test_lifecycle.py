"""Sandbox life cycle, system calls and error categories against the daemon."""

from __future__ import annotations

import time
from typing import Dict

import pytest

import warren
from conftest import IMAGE


async def test_create_with_every_option(w: warren.AsyncWarren) -> None:
    async with w.create(
        IMAGE,
        id="py-every-option",
        backend="container",
        cpu_millis=500,
        memory_bytes=128 << 20,
        pids_max=256,
        disk_bytes=64 << 20,
        env={"GREETING": "hello"},
        workdir="/tmp",
        labels={"role": "opts"},
        timeout_seconds=600,
        hostname="box1",
    ) as sb:
        info = sb.info
        assert info.id == "py-every-option"
        assert info.image == IMAGE and info.backend == "container"
        assert info.state == warren.SandboxState.RUNNING and info.running
        assert info.resources == warren.Resources(cpu_millis=500, memory_bytes=128 << 20, pids_max=256, disk_bytes=64 << 20)
        assert info.env == {"GREETING": "hello"}
        assert info.workdir == "/tmp"
        assert info.labels["role"] == "opts"
        assert info.labels[warren.CREATE_NONCE_LABEL]  # explicit id: retry-safety nonce
        assert info.hostname == "box1"
        assert info.created_at is not None and info.expires_at is not None
        life = info.expires_at_unix_ms - info.created_at_unix_ms
        assert 590_000 <= life <= 610_000
        r = await sb.exec('echo "$GREETING $(pwd) $(hostname)"')
        assert r.text == "hello /tmp box1\n"
        # the disk limit: filling the writable layer fails inside the sandbox only
        r = await sb.exec("dd if=/dev/zero of=/big bs=1M count=100", timeout=60)
        assert r.exit_code != 0 and b"No space left" in r.stderr, r
        with pytest.raises(warren.AlreadyExistsError) as ei:
            await w.create(IMAGE, id="py-every-option")
        assert ei.value.code == "already_exists" and ei.value.category == "conflict"
        assert isinstance(ei.value, warren.ConflictError)
    with pytest.raises(warren.NotFoundError):
        await w.get("py-every-option")


async def test_resources_object(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, resources=warren.Resources(memory_bytes=64 << 20)) as sb:
        assert sb.info.resources.memory_bytes == 64 << 20
    with pytest.raises(ValueError):
        w.create(IMAGE, resources=warren.Resources(), memory_bytes=1)


async def test_get_list_delete_extend(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    a = await w.create(IMAGE, labels={"group": "a"})
    b = await w.create(IMAGE, labels={"group": "b"})
    try:
        assert len(a.id) == 16  # client-generated id
        got = await w.get(a.id)
        assert got.info.id == a.id and got.info.labels["group"] == "a"
        mine = {sb.id for sb in await w.list(labels)}
        assert mine == {a.id, b.id}
        only_a = await w.list(dict(labels, group="a"))
        assert [sb.id for sb in only_a] == [a.id]
        assert a.id in {sb.id for sb in await w.list()}

        before = (await a.refresh()).expires_at_unix_ms
        info = await a.extend_timeout(7200)
        assert info.expires_at_unix_ms > before + 3_000_000
        info2 = await w.extend_timeout(a.id, 60)
        assert info2.expires_at_unix_ms < info.expires_at_unix_ms

        await a.delete()
        with pytest.raises(warren.NotFoundError):
            await a.refresh()
        with pytest.raises(warren.NotFoundError):
            await w.delete(a.id)
        await w.delete(a.id, missing_ok=True)
        assert [sb.id for sb in await w.list(labels)] == [b.id]
    finally:
        await w.delete(a.id, missing_ok=True)
        await w.delete(b.id, missing_ok=True)


async def test_delete_all_reaps_orphans(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    run = {"run": "orphans-%d" % time.time_ns()}
    for _ in range(3):
        await w.create(IMAGE, labels=run)  # "orphaned": no async with
    keep = await w.create(IMAGE)
    try:
        deleted = await w.delete_all(run)
        assert len(deleted) == 3
        assert await w.list(run) == []
        assert (await w.get(keep.id)).id == keep.id
        with pytest.raises(ValueError):
            await w.delete_all({})
    finally:
        await keep.delete()


async def test_sandbox_handle_without_a_call(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        h = w.sandbox(sb.id)
        assert (await h.exec("echo ok")).text == "ok\n"
        info = await h.refresh()
        assert info.image == IMAGE


async def test_errors_carry_categories(w: warren.AsyncWarren) -> None:
    with pytest.raises(warren.InvalidError) as ei:
        await w.create(IMAGE, id="Not Valid!")
    assert ei.value.code == "invalid_argument" and ei.value.category == "invalid" and ei.value.http_status == 400
    with pytest.raises(warren.NotFoundError) as nf:
        await w.sandbox("no-such-sandbox").exec("true")
    assert nf.value.procedure == "warren.v1.SandboxService/Exec"
    with pytest.raises(warren.WarrenError):
        await w.create("no-such-image")
    async with w.create(IMAGE) as sb:
        with pytest.raises(warren.InvalidError):
            await sb.exec("true", timeout=10**9)  # beyond the daemon's maximum


async def test_version_health_metrics(w: warren.AsyncWarren) -> None:
    v = await w.version()
    assert "container" in v.backends and v.cgroup_mode in ("v1", "v2", "hybrid")
    assert await w.health()
    m = await w.metrics()
    assert "warren" in m


async def test_default_labels_are_merged(addr: str, labels: Dict[str, str]) -> None:
    async with warren.AsyncWarren(addr, labels=dict(labels, job="j1")) as w:
        async with w.create(IMAGE, labels={"extra": "x"}) as sb:
            assert sb.info.labels["job"] == "j1" and sb.info.labels["extra"] == "x"
            assert sb.info.labels["pytest-test"] == labels["pytest-test"]


async def test_default_user(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, user="1000:1001") as sb:
        assert sb.info.user == "1000:1001"
        r = await sb.exec("id -u; id -g")
        assert r.text == "1000\n1001\n", r
        r = await sb.exec("id -u", user="root")
        assert r.text == "0\n", r
    with pytest.raises(warren.InvalidError):
        await w.create(IMAGE, user="a:b:c")
