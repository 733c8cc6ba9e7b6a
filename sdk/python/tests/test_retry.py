"""Retries with faults injected between the client and the daemon."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import Dict, List, Tuple

import pytest

import warren
from conftest import IMAGE
from faultproxy import FaultProxy

S = "/warren.v1.SandboxService/"
FAST = warren.RetryPolicy(max_attempts=4, initial_backoff=0.02, max_backoff=0.1)


class _Env:
    """A proxy in front of the daemon and a client that talks through it."""

    def __init__(self, daemon: object, labels: Dict[str, str], retry: warren.RetryPolicy = FAST) -> None:
        self.dir = tempfile.mkdtemp(prefix="wp-")
        self.proxy = FaultProxy(daemon.socket, os.path.join(self.dir, "p.sock"))  # type: ignore[attr-defined]
        self.client = warren.AsyncWarren(self.proxy.addr, labels=labels, retry=retry)

    async def __aenter__(self) -> Tuple[FaultProxy, warren.AsyncWarren]:
        await self.proxy.start()
        return self.proxy, self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.proxy.close()
        shutil.rmtree(self.dir, ignore_errors=True)


async def test_lost_exec_response_is_retried_and_runs_once(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        px.add("drop_response", S + "Exec")
        r = await c.sandbox(sb.id).exec("echo ran >> /tmp/count; wc -l < /tmp/count")
        assert r.text.strip() == "1"
        assert px.count(S + "Exec") == 2  # the lost attempt and the retry
        assert await sb.read_text("/tmp/count") == "ran\n"  # ran exactly once


async def test_without_retries_the_loss_surfaces_and_the_key_recovers(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb, _Env(daemon, labels, retry=warren.NO_RETRY) as (px, c):
        px.add("drop_response", S + "Exec")
        cmd = "echo ran >> /tmp/count; wc -l < /tmp/count"
        with pytest.raises(warren.UnavailableError):
            await c.sandbox(sb.id).exec(cmd, idempotency_key="episode-7-step-3")
        assert await sb.read_text("/tmp/count") == "ran\n"
        # the caller retries by hand with the same key: the cached result
        r = await c.sandbox(sb.id).exec(cmd, idempotency_key="episode-7-step-3")
        assert r.text.strip() == "1"
        assert await sb.read_text("/tmp/count") == "ran\n"


async def test_unavailable_is_retried_with_backoff(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        px.add("status", S + "Get", times=2)
        assert (await c.get(sb.id)).id == sb.id
        assert px.count(S + "Get") == 3
        px.add("status", S + "Get", times=10)
        with pytest.raises(warren.UnavailableError) as ei:
            await c.get(sb.id)
        assert ei.value.http_status == 503
        assert px.count(S + "Get") == 3 + FAST.max_attempts
        px.rules.clear()
        px.add("status", S + "Exec", status=502)
        assert (await c.sandbox(sb.id).exec("echo x")).text == "x\n"


async def test_unsupported_is_never_retried(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    # A backend that cannot do a call answers unsupported (501): permanent,
    # so even an idempotent read goes out once.
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        px.add("status", S + "Get", times=10, status=501)
        with pytest.raises(warren.UnsupportedError) as ei:
            await c.get(sb.id)
        assert ei.value.category == "unsupported" and ei.value.code == "unimplemented" and ei.value.http_status == 501
        assert not isinstance(ei.value, warren.UnavailableError)
        assert px.count(S + "Get") == 1


async def test_connection_refused_is_retried(daemon: object, labels: Dict[str, str]) -> None:
    env = _Env(daemon, labels, retry=warren.RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.2))
    try:
        async def later() -> None:
            await asyncio.sleep(0.5)
            await env.proxy.start()

        starter = asyncio.ensure_future(later())
        v = await env.client.version()  # refused until the proxy listens
        await starter
        assert "container" in v.backends
    finally:
        await env.__aexit__()


async def test_non_idempotent_calls_are_not_retried_after_sending(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        px.add("drop_response", S + "StartProcess")
        with pytest.raises(warren.UnavailableError):
            await c.sandbox(sb.id).start("sleep 300")
        assert px.count(S + "StartProcess") == 1
        assert len(await sb.processes()) == 1  # started once, not twice

        await sb.write_file("/tmp/log", "a\n")
        px.add("drop_response", S + "WriteFile")
        with pytest.raises(warren.UnavailableError):
            await c.sandbox(sb.id).write_file("/tmp/log", "b\n", append=True)
        assert await sb.read_text("/tmp/log") == "a\nb\n"  # appended once

        # a plain write is idempotent: retried
        px.add("drop_response", S + "WriteFile")
        await c.sandbox(sb.id).write_file("/tmp/log", "c\n")
        assert await sb.read_text("/tmp/log") == "c\n"

        # a broken connection is ambiguous from the client's side even when
        # the request never got through: still not resent
        px.add("reset", S + "StartProcess")
        with pytest.raises(warren.UnavailableError):
            await c.sandbox(sb.id).start("true")
        assert px.count(S + "StartProcess") == 2
        assert len(await sb.processes()) == 1


async def test_create_with_a_lost_answer_adopts_its_sandbox(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with _Env(daemon, labels) as (px, c):
        px.add("drop_response", S + "Create")
        sb = await c.create(IMAGE, labels={"which": "generated"})
        try:
            assert px.count(S + "Create") == 2
            # The second is marked a retry (a gateway looks for the id on
            # every node before placing it again).
            sends = [raw for p, raw in px.raw if p == S + "Create"]
            assert b'"retry":true' not in sends[0] and b'"retry":true' in sends[1], sends
            assert [x.id for x in await w.list(dict(labels, which="generated"))] == [sb.id]
            assert sb.info.running
        finally:
            await sb.delete()

        px.add("drop_response", S + "Create")
        sb = await c.create(IMAGE, id="py-retry-explicit")
        try:
            assert px.count(S + "Create") == 4
            assert sb.id == "py-retry-explicit" and sb.info.running
        finally:
            await sb.delete()


async def test_create_does_not_adopt_somebody_elses_sandbox(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE, id="py-taken") as theirs, _Env(daemon, labels) as (px, c):
        px.add("reset", S + "Create")  # ambiguous failure: the retry then meets AlreadyExists
        with pytest.raises(warren.AlreadyExistsError) as ei:
            await c.create(IMAGE, id="py-taken")
        assert ei.value.after_ambiguous_failure
        assert px.count(S + "Create") == 2
        assert (await theirs.refresh()).running  # not deleted by the failed create


async def test_lost_delete_answer_is_success(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    sb = await w.create(IMAGE)
    async with _Env(daemon, labels) as (px, c):
        px.add("drop_response", S + "Delete")
        await c.delete(sb.id)  # the retry meets NotFound: our own doing
        assert px.count(S + "Delete") == 2
    with pytest.raises(warren.NotFoundError):
        await w.get(sb.id)


async def test_mkdir_and_remove_retries(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        h = c.sandbox(sb.id)
        px.add("drop_response", S + "MakeDir")
        await h.mkdir("/work")
        assert (await sb.stat("/work")).is_dir
        px.add("drop_response", S + "RemoveFile")
        await h.remove("/work")
        assert not await sb.exists("/work")


async def test_exec_stream_retried_before_the_first_message(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        px.add("reset", S + "ExecStream")
        st = c.sandbox(sb.id).exec_stream("echo ran >> /tmp/count; cat /tmp/count")
        r = await st.wait()
        assert r.stdout == b"ran\n"
        assert px.count(S + "ExecStream") == 2
        px.add("status", S + "ExecStream")
        r = await c.sandbox(sb.id).exec_stream("echo ok").wait()
        assert r.stdout == b"ok\n"


async def test_archive_upload_and_download_retry(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str], tmp_path: "os.PathLike[str]") -> None:
    src = os.path.join(os.fspath(tmp_path), "src")
    os.makedirs(src)
    with open(os.path.join(src, "f"), "w") as f:
        f.write("payload\n")
    async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
        path = f"/v1/sandboxes/{sb.id}/archive"
        px.add("drop_response", path)  # the PUT
        await c.sandbox(sb.id).upload(src, "/dst")
        assert await sb.read_text("/dst/f") == "payload\n"
        px.add("drop_response", path)  # the GET
        out = os.path.join(os.fspath(tmp_path), "out")
        await c.sandbox(sb.id).download("/dst", out)
        with open(os.path.join(out, "f")) as f:
            assert f.read() == "payload\n"
        assert px.count(path) == 4




IMG = "/warren.v1.ImageService/"


async def test_layer_builds_and_pulls_are_retried_commits_are_not(
    daemon: object, w: warren.AsyncWarren, labels: Dict[str, str], tmp_path: "os.PathLike[str]"
) -> None:
    import io
    import tarfile

    from ocilayout import busybox_layout

    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed")
    base = os.fspath(tmp_path)
    layout = busybox_layout(os.path.join(base, "layout"))
    src = os.path.join(base, "tree")
    os.makedirs(src)
    with open(os.path.join(src, "f"), "w") as f:
        f.write("by path\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo("f")
        ti.size = 9
        tf.addfile(ti, io.BytesIO(b"uploaded\n"))
    try:
        async with w.create(IMAGE) as sb, _Env(daemon, labels) as (px, c):
            # a build makes the same layer again: retried after a lost answer
            put = "/v1/layers/py-retry-layer"
            px.add("drop_response", put)
            layer = await c.build_layer("py-retry-layer", buf.getvalue())
            assert px.count(put) == 2 and layer.name == "py-retry-layer"
            px.add("drop_response", IMG + "BuildLayer")
            by_path = await c.build_layer("py-retry-layer", path=src)
            assert px.count(IMG + "BuildLayer") == 2 and by_path.digest != layer.digest

            # a commit is not resent once the daemon may have got it
            await sb.write_file("/tmp/committed", "yes\n")
            px.add("drop_response", S + "CommitSandbox")
            with pytest.raises(warren.UnavailableError):
                await c.sandbox(sb.id).commit("py-retry-commit")
            assert px.count(S + "CommitSandbox") == 1
            assert "py-retry-commit" in {x.name for x in await w.list_layers()}  # it did happen, once
            px.add("reset", S + "CommitSandbox")
            with pytest.raises(warren.UnavailableError):
                await c.commit_sandbox(sb.id, "py-retry-commit")
            assert px.count(S + "CommitSandbox") == 2

            # a pull is idempotent: retried before the stream starts, also
            # when the daemon may have got the request
            ref = "oci:" + layout.path
            px.add("reset", IMG + "PullImage")
            img = await c.pull_image(ref, "py-retry-pull")
            assert px.count(IMG + "PullImage") == 2 and img.name == "py-retry-pull"
            px.add("drop_response", IMG + "PullImage")
            px.add("status", IMG + "PullImage")
            events: List[warren.PullEvent] = []
            img2 = await c.pull_image(ref, "py-retry-pull", progress=events.append)
            assert px.count(IMG + "PullImage") == 5 and img2.id == img.id
            assert events[0].phase == "resolve" and events[-1].image == img2
            async with w.create("py-retry-pull") as sb2:
                assert (await sb2.exec("pwd")).text == "/work\n"

            # without retries the failure surfaces
            nc = warren.AsyncWarren(px.addr, labels=labels, retry=warren.NO_RETRY)
            try:
                px.add("status", IMG + "PullImage")
                with pytest.raises(warren.UnavailableError):
                    await nc.pull_image(ref, "py-retry-pull")
            finally:
                await nc.close()
    finally:
        await w.remove_image("py-retry-pull", missing_ok=True)
        for n in ("py-retry-layer", "py-retry-commit"):
            await w.remove_layer(n, missing_ok=True)
