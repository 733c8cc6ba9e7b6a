"""Pause, connect and fork through the E2B SDK on a daemon that can
checkpoint its sandboxes (test/e2e TestE2BHibernate: CRIU 4.1): pause is
a hibernation, connect a restore, fork a copy of the running sandbox,
processes included; a snapshot a hibernated copy; a paused sandbox does
not expire."""

import datetime
import os
import time

from e2b import Sandbox


def test_pause_connect_restores(template=os.environ.get("WARREN_E2B_TEMPLATE")):
    s = Sandbox.create(template, timeout=300)
    try:
        s.files.write("/tmp/state.txt", "kept")
        # A background command whose stream is still open: pause ends
        # the stream, as E2B's does, and the command is checkpointed.
        h = s.commands.run("sleep 600", background=True)
        s.commands.run("echo 41 > /tmp/n")
        assert s.pause() is True
        assert s.get_info().state == "paused"
        s2 = Sandbox.connect(s.sandbox_id)
        assert s2.get_info().state == "running"
        assert s2.files.read("/tmp/state.txt") == "kept"
        assert h.pid in [p.pid for p in s2.commands.list()]
        assert s2.commands.run("echo $(( $(cat /tmp/n) + 1 ))").stdout == "42\n"
    finally:
        Sandbox.kill(s.sandbox_id)


def test_fork(template=os.environ.get("WARREN_E2B_TEMPLATE")):
    s = Sandbox.create(template, timeout=300)
    try:
        s.files.write("/tmp/state.txt", "source")
        h = s.commands.run("sleep 600", background=True)
        forks = s.fork(count=2)
        assert len(forks) == 2
        for i, f in enumerate(forks):
            try:
                assert f.sandbox_id != s.sandbox_id
                assert f.files.read("/tmp/state.txt") == "source"
                assert h.pid in [p.pid for p in f.commands.list()]
                f.files.write("/tmp/state.txt", f"fork{i}")
            finally:
                f.kill()
        # The copies are copies: the source's files are its own.
        assert s.files.read("/tmp/state.txt") == "source"
    finally:
        s.kill()


def all_snapshots(**kw):
    p = Sandbox.list_snapshots(**kw)
    out = []
    while p.has_next:
        out += p.next_items()
    return out


def test_snapshot_create_list_use_delete(template=os.environ.get("WARREN_E2B_TEMPLATE")):
    """A snapshot keeps the sandbox's files and processes, leaves the
    source running, is listed by list_snapshots and not by list, makes
    new sandboxes (by id or by name) that are copies with the metadata
    asked for, and is gone after delete_snapshot."""
    s = Sandbox.create(template, timeout=300, metadata={"role": "source"})
    made = []
    snap = None
    try:
        s.files.write("/tmp/state.txt", "snapped")
        h = s.commands.run("sleep 600", background=True)
        snap = s.create_snapshot(name="e2b-suite")
        assert snap.snapshot_id and snap.names == ["snapshot:e2b-suite"]
        assert s.get_info().state == "running"
        s.files.write("/tmp/state.txt", "after")
        assert snap.snapshot_id in [x.snapshot_id for x in all_snapshots(sandbox_id=s.sandbox_id)]
        assert snap.snapshot_id in [x.snapshot_id for x in all_snapshots(name="e2b-suite")]
        listed = [x.sandbox_id for x in Sandbox.list().next_items()]
        assert snap.snapshot_id.removeprefix("snapshot:") not in listed
        for ref in (snap.snapshot_id, snap.names[0]):
            n = Sandbox.create(ref, timeout=300, metadata={"role": "copy"})
            made.append(n)
            assert n.get_info().metadata == {"role": "copy"}
            assert n.files.read("/tmp/state.txt") == "snapped"
            assert h.pid in [p.pid for p in n.commands.list()]
            n.files.write("/tmp/state.txt", "copy")
        assert s.files.read("/tmp/state.txt") == "after"
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        assert snap.snapshot_id not in [x.snapshot_id for x in all_snapshots()]
        # The sandboxes made from it stand on their own.
        assert made[0].files.read("/tmp/state.txt") == "copy"
        snap = None
    finally:
        for n in made:
            n.kill()
        if snap is not None:
            Sandbox.delete_snapshot(snap.snapshot_id)
        s.kill()


def test_paused_sandbox_outlives_its_timeout(template=os.environ.get("WARREN_E2B_TEMPLATE")):
    """A paused sandbox does not expire (E2B keeps it until it is
    resumed): paused with a 3 s timeout and left paused well past it, it
    is still there, and connect resumes it with its state and a fresh
    timeout."""
    s = Sandbox.create(template, timeout=3)
    try:
        s.files.write("/tmp/state.txt", "kept")
        assert s.pause() is True
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            # Polled past the 3 s timeout: never gone meanwhile.
            assert Sandbox.get_info(s.sandbox_id).state == "paused"
            time.sleep(0.5)
        s2 = Sandbox.connect(s.sandbox_id, timeout=120)
        assert s2.files.read("/tmp/state.txt") == "kept"
        left = s2.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)
        assert 100 < left.total_seconds() <= 121
    finally:
        Sandbox.kill(s.sandbox_id)
