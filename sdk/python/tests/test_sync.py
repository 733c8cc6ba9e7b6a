"""The synchronous twin: the same calls, no event loop in sight."""

from __future__ import annotations

import os
import threading
from typing import Dict

import pytest

import warren
from conftest import IMAGE


def test_sync_client_end_to_end(sw: warren.Warren, labels: Dict[str, str], tmp_path: "os.PathLike[str]") -> None:
    assert "container" in sw.version().backends and sw.health()
    assert IMAGE in {i.name for i in sw.list_images()}
    assert sw.get_image(IMAGE).name == IMAGE
    with sw.create(IMAGE, env={"X": "1"}, labels={"k": "v"}) as sb:
        assert isinstance(sb, warren.Sandbox) and sb.info.running
        assert [s.id for s in sw.list(labels)] == [sb.id]
        r = sb.exec("echo $X; exit 2")
        assert r.text == "1\n" and r.exit_code == 2
        with pytest.raises(warren.CommandError):
            sb.exec("false", check=True)

        with sb.exec_stream("echo a; echo b >&2") as st:
            kinds = [ev.kind for ev in st]
        assert kinds[-1] == "result" and st.result is not None and st.result.stdout == b"a\n"
        assert sb.exec_stream("echo w").wait().stdout == b"w\n"

        sb.write_file("/tmp/f", "data")
        sb.write_file("/tmp/f", "+", append=True)
        assert sb.read_text("/tmp/f") == "data+" and sb.read_file("/tmp/f", offset=4) == b"+"
        assert sb.stat("/tmp/f").size == 5 and sb.exists("/tmp/f")
        sb.mkdir("/tmp/d/e", parents=True)
        assert {f.name for f in sb.list_files("/tmp")} >= {"f", "d"}
        sb.remove("/tmp/d", recursive=True)
        assert not sb.exists("/tmp/d")

        src = os.path.join(os.fspath(tmp_path), "src")
        os.makedirs(src)
        with open(os.path.join(src, "a.txt"), "w") as f:
            f.write("A")
        sb.upload(src, "/up")
        assert sb.read_text("/up/a.txt") == "A"
        sb.download("/up", os.path.join(os.fspath(tmp_path), "down"))
        assert open(os.path.join(os.fspath(tmp_path), "down", "a.txt")).read() == "A"
        assert sb.download_tar("/up")
        sb.upload_tar(sb.download_tar("/up"), "/up2")
        assert sb.read_text("/up2/a.txt") == "A"

        p = sb.start("cat")
        p.write_stdin("hi", close=True)
        assert p.wait(10).stdout == b"hi"
        q = sb.start("sleep 300")
        assert [x.id for x in sb.processes()] == [p.id, q.id]
        q.kill()
        assert q.wait(10).signal == 9
        assert not q.refresh().running

        info = sb.extend_timeout(900)
        assert info.expires_at is not None
        assert sb.refresh().id == sb.id
        assert sw.sandbox(sb.id).exec("echo h").text == "h\n"
    with pytest.raises(warren.NotFoundError):
        sw.get(sb.id)


def test_sync_batches(sw: warren.Warren, labels: Dict[str, str]) -> None:
    with sw.create_many(4, IMAGE) as group:
        assert isinstance(group, warren.SandboxGroup) and len(group) == 4
        res = group.exec("echo hi")
        assert res.ok and all(o.unwrap().text == "hi\n" for o in res)
        res2 = sw.exec_many([(group[0], "echo 0"), (group[1].id, "echo 1"), warren.ExecJob(group[2], "exit 1")])
        assert [o.unwrap().exit_code for o in res2] == [0, 0, 1]
    assert sw.list(labels) == []
    ids = sw.delete_all(labels)
    assert ids == []


def test_sync_client_from_many_threads(sw: warren.Warren, labels: Dict[str, str]) -> None:
    with sw.create(IMAGE) as sb:
        out: Dict[int, str] = {}

        def work(i: int) -> None:
            out[i] = sb.exec(["echo", str(i)]).text

        threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out == {i: f"{i}\n" for i in range(16)}


def test_sync_with_deletes_on_exception(sw: warren.Warren) -> None:
    with pytest.raises(ValueError):
        with sw.create(IMAGE) as sb:
            sid = sb.id
            raise ValueError("x")
    with pytest.raises(warren.NotFoundError):
        sw.get(sid)


def test_closed_sync_client_refuses_calls(addr: str) -> None:
    c = warren.Warren(addr)
    c.close()
    c.close()  # idempotent
    with pytest.raises(RuntimeError):
        c.version()


def test_sync_attach_and_pty(sw: warren.Warren) -> None:
    with sw.create(IMAGE) as sb:
        p = sb.start("echo one; read x; echo two $x")
        p.write_stdin("z\n")
        with p.attach() as a:
            events = list(a)
        assert b"".join(e.data for e in events if e.stream == "stdout") == b"one\ntwo z\n"
        assert events[-1].stream == "exit" and a.result is not None and a.result.exit_code == 0
        assert p.attach(stdout_offset=4).wait().exit_code == 0
        t = sb.start(["sh", "-i"], pty=True, rows=20, cols=70)
        t.resize(21, 71)
        t.write_stdin("stty size; exit\n")
        assert b"21 71\r\n" in t.wait(timeout=30).stdout


def test_sync_exec_stream_pty_resize(sw: warren.Warren) -> None:
    with sw.create(IMAGE) as sb:
        with sb.exec_stream(
            'stty size; while [ "$(stty size)" = "24 80" ]; do sleep 0.05; done; stty size', pty=True, timeout=30
        ) as st:
            out, resized = b"", False
            for ev in st:
                out += ev.stdout
                if b"24 80\r\n" in out and not resized:
                    st.resize(22, 77)
                    resized = True
        assert st.result is not None and st.result.stdout == b"24 80\r\n22 77\r\n", st.result
