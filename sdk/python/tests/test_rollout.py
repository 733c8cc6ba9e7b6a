"""Rollout sessions: an agent loop resumes by re-running its code; the
sandbox's trajectory log answers the calls it already has."""

from __future__ import annotations

import pytest

import warren
from conftest import IMAGE
from warren.testing import LocalDaemon


class Preempted(Exception):
    pass


async def agent_loop(sb: warren.AsyncSandbox, preempt_after: int = -1) -> warren.Rollout:
    """The same code on every run: five steps that each append a line (not
    idempotent) and write a note, then a stream reads the file back. The
    trainer may be preempted after some steps."""
    async with warren.rollout(sb, "episode-1") as r:
        await sb.mkdir("/work", parents=True)
        for i in range(5):
            if i == preempt_after:
                raise Preempted(r)
            res = await sb.exec(f"echo step-{i} >> /work/log; wc -l < /work/log", check=True)
            assert res.seq == r.seq
            await sb.write_file("/work/notes", f"note {i}\n", append=True)
        async with sb.exec_stream("cat /work/log") as st:
            async for _ in st:
                pass
        assert st.result is not None and st.result.seq == r.seq
    return r


async def test_rollout_resumes_after_trainer_and_daemon_restart(
    w: warren.AsyncWarren, daemon: LocalDaemon, addr: str, labels: dict
) -> None:
    async with w.create(IMAGE) as sb:
        with pytest.raises(Preempted) as pre:
            await agent_loop(sb, preempt_after=3)
        r = pre.value.args[0]
        assert (r.seq, r.replayed, r.live) == (7, 0, 7)

        # The trainer restarts: a new client, the same code, preempted one
        # step later.
        async with warren.AsyncWarren(addr, labels=labels) as w2:
            sb2 = await w2.get(sb.id)
            with pytest.raises(Preempted) as pre:
                await agent_loop(sb2, preempt_after=4)
            r = pre.value.args[0]
            assert (r.replayed, r.live) == (7, 2)

        daemon.restart()
        async with warren.AsyncWarren(addr, labels=labels) as w3:
            sb3 = await w3.get(sb.id)
            r = await agent_loop(sb3)
            assert (r.replayed, r.live) == (9, 3)  # step 4 and the stream are new
            log = (await sb3.exec("cat /work/log /work/notes")).text
            assert log == "".join(f"step-{i}\n" for i in range(5)) + "".join(f"note {i}\n" for i in range(5))
            # A replayed result is the recorded one: wc counted 2 lines at step 4.
            async with warren.rollout(sb3, "episode-1") as again:
                await sb3.mkdir("/work", parents=True)
                first = await sb3.exec("echo step-0 >> /work/log; wc -l < /work/log")
                await sb3.write_file("/work/notes", "note 0\n", append=True)
                second = await sb3.exec("echo step-1 >> /work/log; wc -l < /work/log")
                assert first.replayed and first.text.strip() == "1" and second.text.strip() == "2"
                # The agent diverges: refused, nothing runs.
                await sb3.write_file("/work/notes", "note 1\n", append=True)
                with pytest.raises(warren.ConflictError, match=r"step 6 of session \"episode-1\".*shell"):
                    await sb3.exec("echo diverged >> /work/log")
                assert again.seq == 6
            assert "diverged" not in (await sb3.exec("cat /work/log")).text

            entries = await sb3.trajectory("episode-1")
            assert [e["seq"] for e in entries][:3] == ["1", "2", "3"]
            assert [e["method"] for e in entries][:3] == ["make_dir", "exec", "write_file"]
            assert entries[1]["exec"]["shell"] == "echo step-0 >> /work/log; wc -l < /work/log"
            assert entries[1]["execResult"]["stdout"]  # base64 of "1\n"
            assert entries[2]["payloadBytes"] == "7" and "content" not in entries[2]["writeFile"]


def test_recorded_steps_replay_without_the_daemon(sw: warren.Warren, daemon: LocalDaemon) -> None:
    """Entering a rollout reads the session's steps; the calls that match
    them are answered without a round trip: with the daemon frozen
    (SIGSTOP) after the rollout began, the recorded part of the loop still
    completes, with the recorded results and errors."""
    import signal

    with sw.create(IMAGE) as sb:
        def body(timeout: float) -> None:
            sb.mkdir("/w", timeout=timeout)
            with pytest.raises(warren.AlreadyExistsError):
                sb.mkdir("/w", timeout=timeout)
            res = sb.exec(["sh", "-c", "cat; echo run >> /w/f"], stdin="in\n", timeout=timeout, env={"A": "1"})
            assert res.text == "in\n" and res.seq == 3
            sb.write_file("/w/g", b"\x00bytes", mode=0o600, timeout=timeout)
            sb.remove("/w/g", timeout=timeout)

        with warren.rollout(sb, "frozen") as r:
            body(5)
        assert (r.live, r.replayed) == (4, 0)  # the failed mkdir is not counted
        assert daemon.proc is not None
        with warren.rollout(sb, "frozen") as r:
            daemon.proc.send_signal(signal.SIGSTOP)
            try:
                body(5)  # the same code: exec timeout is part of the request
            finally:
                daemon.proc.send_signal(signal.SIGCONT)
        assert (r.live, r.replayed) == (0, 4)
        assert sb.exec("cat /w/f").text == "run\n"
        # A request that differs is not answered locally: the daemon
        # refuses it.
        with warren.rollout(sb, "frozen"):
            sb.mkdir("/w")
            with pytest.raises(warren.ConflictError, match="step 2"):
                sb.mkdir("/w", mode=0o700)


def test_sync_rollout(sw: warren.Warren) -> None:
    with sw.create(IMAGE) as sb:
        def loop() -> warren.Rollout:
            with warren.rollout(sb, "sync") as r:
                sb.exec("echo x >> /tmp/f")
                sb.write_file("/tmp/g", "y\n", append=True)
            return r
        assert loop().live == 2
        r = loop()
        assert (r.replayed, r.live) == (2, 0)
        assert sb.exec("cat /tmp/f /tmp/g").text == "x\ny\n"
        assert len(sb.trajectory()) >= 3
        with pytest.raises(RuntimeError):
            with warren.rollout(sb, "a"):
                with warren.rollout(sb, "b"):
                    pass
