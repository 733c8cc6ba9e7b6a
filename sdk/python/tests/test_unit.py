"""Pieces that need no daemon."""

from __future__ import annotations

import asyncio
import builtins
import io
import os
import pickle
import tarfile
from typing import Any, AsyncIterator, Dict, List, Set, Tuple

import pytest

import warren
from warren import _archive
from warren._transport import parse_addr
from warren.errors import error_from_status


def test_parse_addr() -> None:
    assert parse_addr("unix:///run/warren/warren.sock") == ("unix", "/run/warren/warren.sock", "http://warren")
    assert parse_addr("/tmp/w.sock") == ("unix", "/tmp/w.sock", "http://warren")
    assert parse_addr("http://127.0.0.1:7070") == ("http", "127.0.0.1:7070", "http://127.0.0.1:7070")
    assert parse_addr("https://w.example.com/base/") == ("https", "w.example.com", "https://w.example.com/base")
    assert parse_addr("localhost:7070") == ("http", "localhost:7070", "http://localhost:7070")
    for bad in ("ftp://x", "unix:", "nohost", "http://"):
        with pytest.raises(ValueError):
            parse_addr(bad)


def test_error_hierarchy() -> None:
    for cls in (
        warren.NotFoundError,
        warren.InvalidError,
        warren.ExhaustedError,
        warren.ConflictError,
        warren.UnavailableError,
        warren.DeadlineExceededError,
        warren.UnauthenticatedError,
        warren.InternalError,
        warren.UnsupportedError,
        warren.CommandError,
        warren.BatchError,
    ):
        assert issubclass(cls, warren.WarrenError)
    assert issubclass(warren.AlreadyExistsError, warren.ConflictError)
    assert issubclass(warren.TimeoutError, warren.DeadlineExceededError)
    assert issubclass(warren.TimeoutError, builtins.TimeoutError)
    e = warren.TimeoutError("late", timeout=1.5)
    assert str(e) == "late" and e.timeout == 1.5 and e.category == "deadline_exceeded"
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is warren.TimeoutError and e2.timeout == 1.5
    nf = pickle.loads(pickle.dumps(warren.NotFoundError("x", code="not_found", http_status=404)))
    assert nf.code == "not_found" and nf.http_status == 404


def test_error_mapping() -> None:
    cases = {
        ("not_found", None): warren.NotFoundError,
        ("invalid_argument", "invalid"): warren.InvalidError,
        ("resource_exhausted", "exhausted"): warren.ExhaustedError,
        ("failed_precondition", "conflict"): warren.ConflictError,
        ("already_exists", "conflict"): warren.AlreadyExistsError,
        ("unavailable", "unavailable"): warren.UnavailableError,
        ("deadline_exceeded", "deadline_exceeded"): warren.DeadlineExceededError,
        ("unauthenticated", "unauthenticated"): warren.UnauthenticatedError,
        ("internal", "internal"): warren.InternalError,
        ("unimplemented", "unsupported"): warren.UnsupportedError,
        ("unimplemented", None): warren.UnsupportedError,
        # already_exists comes from the code (the daemon decides it by the
        # error's kind); the category stays conflict
        ("already_exists", None): warren.AlreadyExistsError,
        ("unknown", None): warren.InternalError,
        # the category wins over the code when both are given
        ("failed_precondition", "not_found"): warren.NotFoundError,
    }
    for (code, cat), cls in cases.items():
        e = error_from_status(code, "msg", category=cat)
        assert type(e) is cls, (code, cat, type(e))
    assert type(error_from_status(None, "", http_status=503)) is warren.UnavailableError
    assert type(error_from_status(None, "", http_status=501)) is warren.UnsupportedError
    assert not issubclass(warren.UnsupportedError, warren.UnavailableError)
    assert type(error_from_status(None, "", http_status=404)) is warren.NotFoundError


def test_retry_backoff_is_jittered_and_capped() -> None:
    p = warren.RetryPolicy(initial_backoff=0.1, max_backoff=0.5, multiplier=2)
    for n in range(1, 10):
        cap = min(0.5, 0.1 * 2 ** (n - 1))
        vals = [p.backoff(n) for _ in range(200)]
        assert all(0 <= v <= cap for v in vals)
        assert len(set(vals)) > 100  # jittered
    assert warren.NO_RETRY.max_attempts == 1


def test_exec_result_helpers() -> None:
    r = warren.ExecResult(stdout=b"hi\n", stderr=b"oops\n", exit_code=1)
    assert not r.ok and r.text == "hi\n" and r.stderr_text == "oops\n"
    with pytest.raises(warren.CommandError) as ei:
        r.check()
    assert ei.value.result is r and "exited with code 1" in str(ei.value)
    t = warren.ExecResult(stdout_truncated=True, stdout_dropped_bytes=5)
    assert t.truncated
    with pytest.raises(warren.CommandError):
        t.check()
    assert t.check(allow_truncation=True) is t
    assert warren.ExecResult(duration_ms=1500).duration == 1.5


def test_parse_pass_ratio() -> None:
    assert warren.parse_pass_ratio("== 3 passed, 1 failed in 0.1s ==") == 0.75
    assert warren.parse_pass_ratio("5 passed") == 1.0
    assert warren.parse_pass_ratio("2 failed, 2 errors") == 0.0
    assert warren.parse_pass_ratio("nothing here") == 0.0


def test_batch_result() -> None:
    async def main() -> warren.BatchResult[int]:
        async def item(i: int) -> int:
            await asyncio.sleep(0.001 * (5 - i))
            if i == 2:
                raise ValueError("two")
            return i * 10

        return await warren.map_bounded(item, range(5), concurrency=2)

    res = asyncio.run(main())
    assert len(res) == 5 and not res.ok
    assert res.values == [0, 10, None, 30, 40]
    assert res.successes == [0, 10, 30, 40]
    assert [i for i, _ in res.errors] == [2]
    with pytest.raises(warren.BatchError) as ei:
        res.raise_for_errors()
    assert isinstance(ei.value.__cause__, ValueError)
    with pytest.raises(ValueError):
        res[2].unwrap()


def test_gather_bounded_respects_the_bound_and_cancels() -> None:
    async def main() -> None:
        running = 0
        peak = 0

        async def item() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

        await warren.gather_bounded([item for _ in range(50)], 7)
        assert peak == 7

        started = asyncio.Event()
        cleaned = []

        async def slow() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                cleaned.append(1)

        t = asyncio.ensure_future(warren.gather_bounded([slow for _ in range(3)], 3))
        await started.wait()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert len(cleaned) == 3

    asyncio.run(main())


def test_safe_extract_refuses_escapes(tmp_path: "os.PathLike[str]") -> None:
    def tar_with(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.linkname = link
            tf.addfile(ti, io.BytesIO(b""))
        buf.seek(0)
        return buf

    dest = os.path.join(os.fspath(tmp_path), "d")
    for bad in (tar_with("../evil"), tar_with("/abs"), tar_with("l", tarfile.SYMTYPE, "/etc/passwd"), tar_with("l", tarfile.SYMTYPE, "../../x")):
        with pytest.raises(warren.InvalidError):
            _archive.safe_extract(bad, dest)
    assert not os.path.exists(os.path.join(os.fspath(tmp_path), "evil"))
    _archive.safe_extract(tar_with("ok/file"), dest)
    assert os.path.isfile(os.path.join(dest, "ok", "file"))


def test_client_validates_arguments() -> None:
    with pytest.raises(ValueError):
        warren.AsyncWarren("unix:///x", on_truncation="sometimes")
    with pytest.raises(ValueError):
        warren.AsyncWarren("unix:///x", timeout=0)

    async def main() -> None:
        w = warren.AsyncWarren("unix:///nonexistent/warren.sock")
        sb = w.sandbox("abc")
        with pytest.raises(ValueError):
            await sb.exec("true", timeout=-1)
        with pytest.raises(ValueError):
            await sb.exec([])
        with pytest.raises(ValueError):
            await w.delete_all({})
        await w.close()

    asyncio.run(main())


def test_unreachable_daemon_is_unavailable_after_retries() -> None:
    async def main() -> None:
        policy = warren.RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)
        async with warren.AsyncWarren("unix:///nonexistent/warren.sock", retry=policy) as w:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(warren.UnavailableError) as ei:
                await w.version()
            assert "cannot connect" in str(ei.value)
            assert loop.time() - t0 < 5

    asyncio.run(main())


def test_new_message_types_parse_the_json_mapping() -> None:
    from warren._types import Image, Layer, LayerStat, LayerVerification, PullEvent, SandboxInfo

    img = Image._from_json({
        "name": "python:3.12", "id": "sha256:i", "layers": ["sha256:a", "sha256:b"], "sizeBytes": "123",
        "createdAtUnixMs": "1700000000000", "diffIds": ["sha256:x", "sha256:y"], "source": "r@sha256:m",
        "env": ["PATH=/usr/bin", "A=b=c"], "entrypoint": ["/e"], "cmd": ["python3"], "workingDir": "/app",
        "user": "1000:1000", "platform": "linux/amd64",
    })
    assert img.size_bytes == 123 and img.diff_ids == ("sha256:x", "sha256:y") and img.source == "r@sha256:m"
    assert img.env_dict == {"PATH": "/usr/bin", "A": "b=c"} and img.entrypoint == ("/e",) and img.cmd == ("python3",)
    assert (img.working_dir, img.user, img.platform) == ("/app", "1000:1000", "linux/amd64")
    assert Image._from_json({"name": "old"}) == Image(name="old")  # fields left out are zero

    layer = Layer._from_json({"name": "ws", "digest": "sha256:d", "diffId": "sha256:t", "sizeBytes": "5",
                              "blobSizeBytes": "4096", "files": "2", "createdAtUnixMs": "1700000000000"})
    assert (layer.size_bytes, layer.blob_size_bytes, layer.files) == (5, 4096, 2) and layer.created_at is not None

    ev = PullEvent._from_json({"phase": "layer", "layer": 1, "layers": 3, "status": "downloading",
                               "current": "50", "total": "200", "digest": "sha256:c"})
    assert (ev.layer, ev.layers, ev.current, ev.total) == (1, 3, 50, 200) and ev.fraction == 0.25 and not ev.done
    assert PullEvent._from_json({"phase": "resolve"}).fraction is None
    done = PullEvent._from_json({"phase": "done", "layers": 2, "image": {"name": "n"}})
    assert done.done and done.image == Image(name="n")

    st = LayerStat._from_json({"digest": "sha256:d", "format": "erofs", "size": "1000", "resident": "250",
                               "files": "3", "mounted": True, "refs": 2, "owner": "layer:ws",
                               "blobResident": "50", "filesResident": "200", "directIo": True, "readAheadKb": 128})
    assert st.resident_fraction == 0.25 and st.mounted and st.refs == 2 and st.owner == "layer:ws"
    assert (st.blob_resident, st.files_resident, st.direct_io, st.read_ahead_kb) == (50, 200, True, 128)
    assert LayerStat().resident_fraction == 0.0
    v = LayerVerification._from_json({"digest": "sha256:d", "error": "digest mismatch"})
    assert not v.ok and v.error == "digest mismatch"
    assert SandboxInfo._from_json({"id": "x", "layers": ["a", "b"]}).layers == ("a", "b")
    assert SandboxInfo._from_json({"id": "x"}).layers == ()


def _fake_pull_client(streams: List[List[Any]]) -> Tuple[warren.AsyncWarren, List[int]]:
    """A client whose PullImage streams are scripted: each list is one
    attempt's messages (dicts) and errors (raised where they stand)."""
    policy = warren.RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002)
    w = warren.AsyncWarren("unix:///nonexistent/warren.sock", retry=policy)
    calls: List[int] = []

    async def server_stream(procedure: str, body: object, **kw: object) -> AsyncIterator[Dict[str, Any]]:
        assert procedure == "warren.v1.ImageService/PullImage" and kw["idempotent"] is True
        calls.append(1)
        for item in streams[min(len(calls), len(streams)) - 1]:
            if isinstance(item, BaseException):
                raise item
            yield item

    w._t.server_stream = server_stream  # type: ignore[method-assign]
    return w, calls


def test_pull_stream_broken_midway_is_started_over() -> None:
    resolve = {"phase": "resolve"}
    layer = {"phase": "layer", "layers": 1, "status": "downloading", "current": "1", "total": "2"}
    done = {"phase": "done", "layers": 1, "image": {"name": "img", "id": "sha256:i"}}

    def broken() -> warren.UnavailableError:
        return warren.UnavailableError("connection reset", code="unavailable")

    async def main() -> None:
        # broken once after an event: started over, events begin again
        w, calls = _fake_pull_client([[resolve, layer, broken()], [resolve, layer, done]])
        seen: List[str] = []
        pull = w.pull_image("oci:/x", "img", progress=lambda e: seen.append(e.phase))
        img = await pull
        assert img.name == "img" and pull.image == img and pull.restarts == 1 and len(calls) == 2
        assert seen == ["resolve", "layer", "resolve", "layer", "done"]

        # broken every time: given up after the policy's attempts
        w, calls = _fake_pull_client([[resolve, broken()]])
        with pytest.raises(warren.UnavailableError) as ei:
            await w.pull_image("oci:/x")
        assert len(calls) == 3 and ei.value.after_ambiguous_failure

        # a failure before the first event was the transport's to retry: not again
        w, calls = _fake_pull_client([[broken()], [resolve, done]])
        with pytest.raises(warren.UnavailableError):
            await w.pull_image("oci:/x")
        assert len(calls) == 1

        # other errors are not transient
        w, calls = _fake_pull_client([[resolve, warren.NotFoundError("no such layout")], [resolve, done]])
        with pytest.raises(warren.NotFoundError):
            await w.pull_image("oci:/x")
        assert len(calls) == 1

        # a stream that ends without the image
        w, calls = _fake_pull_client([[resolve, layer]])
        with pytest.raises(warren.UnavailableError, match="without the image"):
            await w.pull_image("oci:/x")

        # iterating: the events, then nothing
        w, calls = _fake_pull_client([[resolve, done]])
        async with w.pull_image("oci:/x") as p:
            kinds = [e.phase async for e in p]
        assert kinds == ["resolve", "done"] and p.image is not None and p.image.name == "img"
        assert [e async for e in p] == []

    asyncio.run(main())


def test_sync_twin_has_the_async_methods() -> None:
    def public(cls: type) -> Set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    # the sync client leaves out map (use the async API for concurrent
    # Python code) and a few attributes of the async client's internals
    assert public(warren.AsyncWarren) - public(warren.Warren) <= {"map", "create_reap_grace", "max_connections", "retry"}
    assert public(warren.AsyncSandbox) <= public(warren.Sandbox)
    assert public(warren.ImagePull) - {"aclose"} <= public(warren.SyncImagePull)
    for name in ("pull_image", "pull_image_stream", "build_layer", "list_layers", "remove_layer",
                 "image_stats", "verify_image", "commit_sandbox"):
        assert name in public(warren.Warren)
    assert {"commit", "layers"} <= public(warren.Sandbox)


def test_display_types() -> None:
    """The fullvm backend's display: an InputEvent sends only what it sets
    (proto3 JSON), a Screenshot decodes its base64 PNG, SandboxInfo has
    the VNC socket."""
    assert warren.InputEvent("key", key="a", action="down")._to_json() == {"kind": "key", "key": "a", "action": "down"}
    assert warren.InputEvent("move", x=0, y=7)._to_json() == {"kind": "move", "y": 7}
    shot = warren.Screenshot._from_json({"png": "iVBORw==", "width": 1280, "height": "800"})
    assert shot.png == b"\x89PNG" and (shot.width, shot.height) == (1280, 800)
    assert warren.SandboxInfo._from_json({"vnc": "/var/lib/warren/fullvm/vms/x/vnc.sock"}).vnc.endswith("vnc.sock")
    assert warren.SandboxInfo._from_json({}).vnc == ""
