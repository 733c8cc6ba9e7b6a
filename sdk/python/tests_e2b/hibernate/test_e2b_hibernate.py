"""Pause, connect and fork through the E2B SDK on a daemon that can
checkpoint its sandboxes (test/e2e TestE2BHibernate: CRIU 4.1): pause is
a hibernation, connect a restore, fork a copy of the running sandbox,
processes included."""

import os

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
