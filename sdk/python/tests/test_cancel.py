"""Cancellation, deadlines and clean-up: the pains RL trainers hit."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import textwrap
from typing import Dict

import pytest

import warren
from conftest import IMAGE, eventually, ps
from faultproxy import FaultProxy

EXEC = "/warren.v1.SandboxService/Exec"
GET = "/warren.v1.SandboxService/Get"


async def test_cancel_mid_exec_kills_the_process(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        task = asyncio.ensure_future(sb.exec("exec sleep 300"))

        async def running() -> bool:
            return "sleep 300" in await ps(sb)

        assert await eventually(running)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        async def gone() -> bool:
            return "sleep 300" not in await ps(sb)

        assert await eventually(gone), await ps(sb)
        # the sandbox stays usable
        assert (await sb.exec("echo still here")).text == "still here\n"
        assert (await sb.refresh()).running


async def test_cancel_mid_exec_of_a_process_tree(w: warren.AsyncWarren) -> None:
    async with w.create(IMAGE) as sb:
        task = asyncio.ensure_future(sb.exec("sleep 301 & sleep 302 & wait"))

        async def running() -> bool:
            out = await ps(sb)
            return "sleep 301" in out and "sleep 302" in out

        assert await eventually(running)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        async def gone() -> bool:
            out = await ps(sb)
            return "sleep 301" not in out and "sleep 302" not in out

        assert await eventually(gone), await ps(sb)


async def test_client_deadline_closes_the_call_and_the_daemon_kills_the_command(
    addr: str, labels: Dict[str, str], w: warren.AsyncWarren
) -> None:
    # deadline = timeout + margin = 30 - 28 = 2 s: the client's deadline
    # passes long before the daemon's exec timeout.
    async with warren.AsyncWarren(addr, labels=labels, deadline_margin=-28) as c:
        async with c.create(IMAGE) as sb:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(warren.TimeoutError) as ei:
                await sb.exec("exec sleep 300", timeout=30)
            took = loop.time() - t0
            assert 1.5 < took < 6, took
            assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, warren.DeadlineExceededError)

            async def gone() -> bool:
                return "sleep 300" not in await ps(sb)

            assert await eventually(gone), await ps(sb)


async def test_timeouts_fire_when_the_daemon_hangs(daemon: object, w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    d = tempfile.mkdtemp(prefix="wp-")
    async with FaultProxy(daemon.socket, os.path.join(d, "p.sock")) as px:  # type: ignore[attr-defined]
        async with w.create(IMAGE) as sb, warren.AsyncWarren(px.addr, labels=labels, deadline_margin=0.5) as c:
            loop = asyncio.get_running_loop()
            px.add("blackhole", GET, times=100)
            t0 = loop.time()
            with pytest.raises(warren.TimeoutError):
                await c.get(sb.id, timeout=0.5)
            assert loop.time() - t0 < 3

            px.add("blackhole", EXEC, times=100)
            t0 = loop.time()
            with pytest.raises(warren.TimeoutError):
                await c.sandbox(sb.id).exec("true", timeout=1)  # deadline 1 + 0.5 s
            took = loop.time() - t0
            assert 1.4 < took < 4, took

            # streams too: the deadline covers the whole stream
            px.add("blackhole", "/warren.v1.SandboxService/ExecStream", times=100)
            t0 = loop.time()
            with pytest.raises(warren.TimeoutError):
                await c.sandbox(sb.id).exec_stream("true", timeout=1).wait()
            assert loop.time() - t0 < 4
    os.rmdir(d)


async def test_async_with_deletes_on_exception(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    with pytest.raises(RuntimeError):
        async with w.create(IMAGE) as sb:
            sid = sb.id
            raise RuntimeError("boom")
    with pytest.raises(warren.NotFoundError):
        await w.get(sid)


async def test_async_with_deletes_on_cancellation(w: warren.AsyncWarren) -> None:
    created: "asyncio.Future[str]" = asyncio.get_running_loop().create_future()

    async def episode() -> None:
        async with w.create(IMAGE) as sb:
            created.set_result(sb.id)
            await sb.exec("sleep 300")

    task = asyncio.ensure_future(episode())
    sid = await created
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(warren.NotFoundError):
        await w.get(sid)


async def test_cancelled_create_never_leaks(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    # Cancelling right as the request leaves is the hard case: the daemon may
    # register the sandbox only after the client's first clean-up look.
    for i, delay in enumerate([0] * 16 + [0.0005] * 8 + [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2]):
        mine = dict(labels, attempt=str(i))
        task = asyncio.ensure_future(w.create(IMAGE, labels=mine))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            sb = await task
        except asyncio.CancelledError:
            pass
        else:
            await sb.delete()  # the create finished first: the caller owns it
        assert await w.list(mine) == [], f"leak after cancelling at {delay}s"

    # the same with an explicit id
    for i, delay in enumerate([0.005, 0.02, 0.1]):
        task = asyncio.ensure_future(w.create(IMAGE, id=f"py-cancel-{i}"))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            await (await task).delete()
        except asyncio.CancelledError:
            pass
        with pytest.raises(warren.NotFoundError):
            await w.get(f"py-cancel-{i}")


async def test_cancelled_create_many_never_leaks(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    task = asyncio.ensure_future(w.create_many(12, IMAGE, concurrency=4))
    await asyncio.sleep(0.5)
    task.cancel()
    try:
        group = await task
    except asyncio.CancelledError:
        pass
    else:
        await group.delete()
    assert await w.list(labels) == []


_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, warren
    addr, label = sys.argv[1], sys.argv[2]
    if sys.argv[3] == "async":
        async def main():
            async with warren.AsyncWarren(addr, labels={"ki": label}) as w:
                async with w.create("busybox") as sb:
                    print(sb.id, flush=True)
                    await sb.exec("sleep 300")
        asyncio.run(main())
    else:
        with warren.Warren(addr, labels={"ki": label}) as w:
            with w.create("busybox") as sb:
                print(sb.id, flush=True)
                sb.exec("sleep 300")
    """
)


@pytest.mark.parametrize("flavor", ["async", "sync"])
async def test_keyboard_interrupt_deletes_the_sandbox(w: warren.AsyncWarren, addr: str, flavor: str) -> None:
    label = f"ki-{os.getpid()}-{flavor}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(warren.__file__)), env.get("PYTHONPATH", "")] if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SCRIPT, addr, label, flavor,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        sid = line.decode().strip()
        assert sid, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        sb = w.sandbox(sid)

        async def running() -> bool:
            return "sleep 300" in await ps(sb)

        assert await eventually(running, timeout=30)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode != 0
        assert b"KeyboardInterrupt" in err, err.decode()
        assert await w.list({"ki": label}) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await w.delete_all({"ki": label})


def test_sync_keyboard_interrupt_kills_the_command_and_deletes(sw: warren.Warren, labels: Dict[str, str]) -> None:
    import _thread
    import threading
    import time

    sid = ""
    probe = sw.create(IMAGE)  # to look at processes from outside
    try:
        with pytest.raises(KeyboardInterrupt):
            with sw.create(IMAGE) as sb:
                sid = sb.id

                def interrupt() -> None:
                    for _ in range(100):
                        out = sw.sandbox(sid).exec(["ps", "-o", "args"]).text
                        if "sleep 300" in out:
                            break
                        time.sleep(0.1)
                    _thread.interrupt_main()

                threading.Thread(target=interrupt, daemon=True).start()
                sb.exec("sleep 300")
        with pytest.raises(warren.NotFoundError):
            sw.get(sid)
    finally:
        probe.delete()
