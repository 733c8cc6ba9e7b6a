"""exec, streaming exec, idempotency and background processes."""

from __future__ import annotations

import asyncio
import signal
import warnings
from typing import Dict

import pytest

import warren
from conftest import IMAGE, eventually, ps


async def test_exec_result_fields(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, workdir="/tmp", env={"A": "sandbox"}) as sb:
        r = await sb.exec("echo out; echo err >&2; exit 7")
        assert r.stdout == b"out\n" and r.stderr == b"err\n"
        assert r.exit_code == 7 and r.signal == 0 and not r.ok
        assert not r.timed_out and not r.oom_killed and not r.truncated
        assert r.pid > 0 and r.duration_ms >= 0 and r.duration == r.duration_ms / 1000

        r = await sb.exec(["sh", "-c", 'echo "$0 $A $B $(pwd) $(id -u)"', "argv0"], env={"B": "call"}, cwd="/", user="1000")
        assert r.text == "argv0 sandbox call / 1000\n"

        r = await sb.exec("cat", stdin=b"\x00binary\xff")
        assert r.stdout == b"\x00binary\xff"
        r = await sb.exec(["wc", "-c"], stdin="héllo")
        assert r.text.strip() == "6"

        with pytest.raises(warren.CommandError) as ei:
            await sb.exec("echo bad >&2; exit 3", check=True)
        assert ei.value.result.exit_code == 3 and "bad" in str(ei.value)
        assert (await sb.exec("true", check=True)).ok


async def test_exec_killed_by_signal(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        r = await sb.exec("kill -9 $$")
        assert r.exit_code == -1 and r.signal == signal.SIGKILL and not r.ok


async def test_exec_timeout_kills_the_command(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        r = await sb.exec("sleep 30", timeout=1)
        assert r.timed_out and not r.ok
        assert loop.time() - t0 < 10
        assert 900 <= r.duration_ms < 10_000
        assert "sleep 30" not in await ps(sb)
        with pytest.raises(warren.CommandError, match="timed out"):
            r.check()


async def test_oom_is_reported(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE, memory_bytes=32 << 20) as sb:
        r = await sb.exec("dd if=/dev/zero of=/dev/null bs=256M count=1", timeout=60)
        assert r.oom_killed, r
        assert not r.ok
        assert (await sb.exec("echo alive")).text == "alive\n"


async def test_truncation_is_never_silent(w: warren.AsyncWarren, addr: str, labels: Dict[str, str]) -> None:
    async with w.create(IMAGE) as sb:
        with pytest.warns(warren.OutputTruncatedWarning):
            r = await sb.exec("yes | head -c 5000; yes e | head -c 3000 >&2", output_limit=1000)
        assert r.stdout_truncated and r.stderr_truncated and r.truncated
        assert len(r.stdout) == 1000 and r.stdout_dropped_bytes == 4000
        assert len(r.stderr) == 1000 and r.stderr_dropped_bytes == 2000
        with pytest.raises(warren.CommandError, match="truncated"):
            r.check()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await sb.exec("yes | head -c 100", output_limit=1000)  # within the limit: no warning

        async with warren.AsyncWarren(addr, labels=labels, on_truncation="raise") as strict:
            with pytest.raises(warren.CommandError) as ei:
                await strict.sandbox(sb.id).exec("yes | head -c 5000", output_limit=100)
            assert ei.value.result.stdout_dropped_bytes == 4900
        async with warren.AsyncWarren(addr, labels=labels, on_truncation="ignore") as lax:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                r = await lax.sandbox(sb.id).exec("yes | head -c 5000", output_limit=100)
            assert r.truncated


async def test_exec_stream(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        events = []
        async with sb.exec_stream("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done; exit 4") as st:
            async for ev in st:
                events.append(ev)
        assert events[-1].kind == "result"
        res = st.result
        assert res is not None and events[-1].result == res
        assert res.exit_code == 4
        assert res.stdout == b"out1\nout2\nout3\n" and res.stderr == b"err1\nerr2\nerr3\n"
        chunks = [ev.kind for ev in events[:-1]]
        assert set(chunks) == {"stdout", "stderr"}
        assert b"".join(ev.data for ev in events if ev.kind == "stdout") == res.stdout

        # wait() consumes the rest
        st2 = sb.exec_stream(["echo", "x"])
        r2 = await st2.wait()
        assert r2.stdout == b"x\n"

        # errors arrive as exceptions
        with pytest.raises(warren.NotFoundError):
            async for _ in w.sandbox("no-such-sandbox").exec_stream("true"):
                pass


async def test_exec_stream_early_exit_kills_the_command(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        async with sb.exec_stream("echo started; exec sleep 300") as st:
            async for ev in st:
                assert ev.stdout == b"started\n"
                break

        async def gone() -> bool:
            return "sleep 300" not in await ps(sb)

        assert await eventually(gone), await ps(sb)
        assert (await sb.exec("echo usable")).text == "usable\n"


async def test_idempotent_exec_is_not_run_twice(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        cmd = "echo run >> /tmp/count; wc -l < /tmp/count"
        r1 = await sb.exec(cmd, idempotency_key="step-1")
        r2 = await sb.exec(cmd, idempotency_key="step-1")
        assert r1 == r2  # the cached result, same pid and output
        assert (await sb.read_text("/tmp/count")) == "run\n"
        r3 = await sb.exec(cmd, idempotency_key="step-2")
        assert r3.text.strip() == "2"
        # a concurrent duplicate waits for the first run instead of running
        a, b = await asyncio.gather(
            sb.exec("sleep 0.5; echo run >> /tmp/count", idempotency_key="k3"),
            sb.exec("sleep 0.5; echo run >> /tmp/count", idempotency_key="k3"),
        )
        assert a == b
        assert (await sb.read_text("/tmp/count")).count("run") == 3
        # streaming replays the cached output
        st = sb.exec_stream(cmd, idempotency_key="step-1")
        assert (await st.wait()).stdout == r1.stdout


async def test_background_processes(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        p = await sb.start("cat; echo done >&2")
        assert p.id.startswith("p-") and p.pid > 0 and p.info.running
        await p.write_stdin("line1\n")
        await p.write_stdin(b"line2\n", close=True)
        r = await p.wait(timeout=30)
        assert r.stdout == b"line1\nline2\n" and r.stderr == b"done\n" and r.exit_code == 0
        info = await p.refresh()
        # The listed result is the exit only; wait and attach carry the output.
        assert not info.running and info.result is not None and info.result.exit_code == 0 and info.result.stdout == b""
        assert info.stdout_bytes == len(r.stdout) and info.stderr_bytes == len(r.stderr)

        q = await sb.start(["sleep", "300"])
        with pytest.raises(warren.DeadlineExceededError) as ei:
            await q.wait(timeout=0.5)
        assert not isinstance(ei.value, warren.TimeoutError)  # the daemon's deadline, not ours
        procs = await sb.processes()
        assert [x.id for x in procs] == [p.id, q.id]
        assert [x.info.running for x in procs] == [False, True]
        await q.signal(signal.SIGTERM)
        r = await q.wait(timeout=30)
        assert r.signal == signal.SIGTERM and r.exit_code == -1
        with pytest.raises(warren.ConflictError):
            await q.signal()
        await q.kill()  # exited: fine

        g = await sb.start("sleep 300 & sleep 300; wait")
        await g.kill()
        assert (await g.wait(timeout=30)).signal == signal.SIGKILL

        t = await sb.start("sleep 300", timeout=0.5)
        rt = await t.wait(timeout=30)
        assert rt.timed_out

        with pytest.raises(warren.NotFoundError):
            await sb.process("p-999").wait(timeout=1)
        h = sb.process(p.id)
        assert (await h.wait(timeout=5)).stdout == b"line1\nline2\n"


async def test_attach_and_pty(w: warren.AsyncWarren) -> None:
    """Two attaches from different offsets get their bytes and the exit; a
    pty process sees its size and a resize, and runs an interactive shell."""
    async with w.create(IMAGE) as sb:
        p = await sb.start("printf 0123456789; read x; printf abc; exit 3")
        got: dict = {}

        async def follow(name: str, off: int) -> None:
            out = bytearray()
            first = None
            async with p.attach(stdout_offset=off, stderr_offset=-1) as a:
                async for ev in a:
                    if ev.stream == "stdout":
                        first = ev.offset if first is None else first
                        out += ev.data
                got[name] = (bytes(out), first, a.result)

        tasks = [asyncio.ensure_future(follow("all", 0)), asyncio.ensure_future(follow("later", 4))]
        await asyncio.sleep(0.3)
        await p.write_stdin("\n")
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert got["all"][0] == b"0123456789abc" and got["all"][1] == 0 and got["all"][2].exit_code == 3
        assert got["later"][0] == b"456789abc" and got["later"][1] == 4

        t = await sb.start("stty size", pty=True, rows=33, cols=101)
        assert (await t.wait(timeout=30)).stdout == b"33 101\r\n"
        s = await sb.start(["sh", "-i"], pty=True)
        await s.resize(40, 120)
        await s.write_stdin("stty size; echo h''i; exit 4\n")
        r = await s.wait(timeout=30)
        assert b"40 120\r\n" in r.stdout and b"\r\nhi\r\n" in r.stdout and r.exit_code == 4
        assert (await s.refresh()).pty
        r = await sb.exec("stty size; [ -t 1 ] && echo tty", pty=True, rows=5, cols=6)
        assert r.stdout == b"5 6\r\ntty\r\n" and r.stderr == b""
        async with sb.exec_stream("stty size", pty=True, rows=7, cols=8) as st:
            assert (await st.wait()).stdout == b"7 8\r\n"
        with pytest.raises(ValueError):
            await sb.start("true", rows=10)


# Waits for the terminal's size to change from the default; the trap shows
# that the resize sent SIGWINCH.
_RESIZE_SCRIPT = (
    "trap 'echo winch' WINCH; stty size; "
    'while [ "$(stty size)" = "24 80" ]; do sleep 0.05; done; sleep 0.2; stty size'
)


async def test_exec_stream_pty_resize(w: warren.AsyncWarren) -> None:
    """A running exec_stream on a pty is resized: the command sees the new
    size and a SIGWINCH; once it exited its id is gone."""
    async with w.create(IMAGE) as sb:
        async with sb.exec_stream(_RESIZE_SCRIPT, pty=True, timeout=30) as st:
            with pytest.raises(warren.ConflictError):
                await st.resize(30, 90)  # nothing read yet: no id
            out, resized = bytearray(), False
            async for ev in st:
                out += ev.stdout
                if b"24 80\r\n" in out and not resized:
                    await st.resize(50, 132)
                    resized = True
        assert st.process_id and st.process_id.startswith("e-")
        r = st.result
        assert r is not None and r.exit_code == 0 and not r.timed_out, (r, bytes(out))
        assert b"winch\r\n" in r.stdout and r.stdout.endswith(b"50 132\r\n"), r.stdout
        with pytest.raises(warren.NotFoundError):
            await st.resize(10, 10)
        async with sb.exec_stream("true") as plain:
            await plain.wait()
            with pytest.raises(ValueError):
                await plain.resize(10, 10)
