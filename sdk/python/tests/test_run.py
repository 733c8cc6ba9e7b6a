"""The fncall backend through the SDK: run (one job) and run_batch."""

from __future__ import annotations

import pytest

import warren
from conftest import IMAGE


def test_run_statuses_and_files(sw: warren.Warren) -> None:
    # A program's failure is a status, never an exception.
    r = sw.run(IMAGE, "echo hi; exit 3")
    assert r.last.status == "non_zero_exit" and r.last.exit_code == 3 and r.last.stdout == b"hi\n"
    r = sw.run(IMAGE, ["sleep", "5"], wall=0.2)
    assert r.last.status == "time_limit"
    r = sw.run(IMAGE, ["yes"], output_bytes=1000)
    assert r.last.status == "output_limit" and len(r.last.stdout) == 1000 and r.last.stdout_truncated
    # Steps in order, an input file from an earlier step's output.
    r = sw.run(
        IMAGE,
        steps=[
            warren.Step("tr a-z A-Z < in > out; id -u", files={"in": b"abc\n"}, outputs=["out"]),
            warren.Step(["cat", "again"], files={"again": (0, "out")}),
        ],
    )
    assert r.ok, r
    assert r.steps[0].stdout == b"1000\n" and r.steps[0].file("out").data == b"ABC\n"
    assert r.steps[1].stdout == b"ABC\n" and r.steps[1].wall_us > 0


def test_run_disk_quota(sw: warren.Warren) -> None:
    # Two files under the file size limit, together past the job's quota.
    r = sw.run(IMAGE, "head -c 10000000 /dev/zero > a; head -c 10000000 /dev/zero > /tmp/b", disk_bytes=16 << 20)
    assert r.last.status == "output_limit" and r.last.error.startswith("disk:"), r
    r = sw.run(IMAGE, "ls -A . /tmp; head -c 10000000 /dev/zero > a && echo ok", disk_bytes=16 << 20)
    assert r.ok and r.last.stdout.endswith(b"ok\n"), r


def test_run_invalid(sw: warren.Warren) -> None:
    with pytest.raises(warren.InvalidError):
        sw.run(IMAGE, "true", backend="container")
    with pytest.raises(ValueError):
        sw.run(IMAGE)


def test_run_batch(sw: warren.Warren) -> None:
    jobs = [f"echo {i}; exit {i % 2}" for i in range(12)]
    items = sw.run_batch(IMAGE, jobs, parallelism=3)
    assert sorted(i for i, _ in items) == list(range(12))
    for i, r in items:
        assert isinstance(r, warren.RunResult), r
        assert r.last.stdout == f"{i}\n".encode()
        assert r.last.status == ("accepted" if i % 2 == 0 else "non_zero_exit")


def test_gpus_none_here(sw: warren.Warren) -> None:
    # The test daemon is given no GPU: it lists none, and a job that asks
    # for one is refused at once, saying how many the node has.
    assert sw.version().gpus == ()
    with pytest.raises(warren.InvalidError, match="this node has 0"):
        sw.run(IMAGE, "true", gpus=1)
    with pytest.raises(warren.InvalidError, match="this node has 0"):
        sw.run_batch(IMAGE, ["true"], gpus=1, shared_gpu=True)


def test_fncall_sandbox(sw: warren.Warren) -> None:
    # backend="fncall": a sandbox from the pool, used as any other.
    assert "fncall" in sw.version().backends
    sb = sw.create(IMAGE, backend="fncall", hostname="judge")
    try:
        assert sb.info.backend == "fncall"
        r = sb.exec("hostname; echo hi > /tmp/f")
        assert r.exit_code == 0 and r.stdout == b"judge\n", r
        assert sb.read_file("/tmp/f") == b"hi\n"
        with pytest.raises(warren.UnsupportedError):
            sb.hibernate()
    finally:
        sb.delete()
    with pytest.raises(warren.InvalidError, match="container, fncall"):
        sw.create(IMAGE, backend="nosuch")
