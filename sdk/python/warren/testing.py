"""Run a private Warren daemon, for tests and benchmarks.

:class:`LocalDaemon` starts ``warren serve`` with its own state, runtime
and socket directories under a temporary directory and its own cgroup
parent, so it never touches a system daemon; :meth:`LocalDaemon.stop`
deletes its sandboxes, stops it and removes everything it made. Needs root
(namespaces, mounts, cgroups) and a ``warren`` binary."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from typing import IO, List, Optional, Sequence

__all__ = ["LocalDaemon", "find_warren_binary"]


def find_warren_binary(start: Optional[str] = None) -> Optional[str]:
    """``$WARREN_BIN``, else ``bin/warren`` of the repository holding
    ``start`` (default: this file), else ``warren`` on PATH."""
    env = os.environ.get("WARREN_BIN")
    if env:
        return env
    d = os.path.abspath(start or os.path.dirname(__file__))
    while True:
        cand = os.path.join(d, "bin", "warren")
        if os.path.isfile(cand) and os.access(cand, os.X_OK) and os.path.isfile(os.path.join(d, "go.mod")):
            return cand
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return shutil.which("warren")


class LocalDaemon:
    """A ``warren serve`` of its own (see the module docstring)::

        d = LocalDaemon("/work/main/bin/warren")
        d.start()
        d.build_busybox_image("busybox")
        ... AsyncWarren(d.addr) ...
        d.stop()
    """

    def __init__(
        self,
        binary: str,
        *,
        base_dir: Optional[str] = None,
        extra_args: Sequence[str] = (),
        log_level: str = "info",
    ) -> None:
        self.binary = binary
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="warren-py-")
        self.owns_dir = base_dir is None
        self.state_dir = os.path.join(self.base_dir, "state")
        self.run_dir = os.path.join(self.base_dir, "run")
        self.socket = os.path.join(self.base_dir, "warren.sock")
        self.log_path = os.path.join(self.base_dir, "daemon.log")
        self.cgroup_parent = "warren-py-%d-%s" % (os.getpid(), os.path.basename(self.base_dir).replace("_", "-"))
        self.extra_args = list(extra_args)
        self.log_level = log_level
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None

    @property
    def addr(self) -> str:
        return "unix://" + self.socket

    def start(self, wait: float = 30.0) -> "LocalDaemon":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "serve",
                "--state-dir",
                self.state_dir,
                "--run-dir",
                self.run_dir,
                "--socket",
                self.socket,
                "--cgroup-parent",
                self.cgroup_parent,
                "--log-level",
                self.log_level,
                *self.extra_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._healthy():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"warren serve did not come up within {wait}s:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        import socket

        if not os.path.exists(self.socket):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(self.socket)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: warren\r\nConnection: close\r\n\r\n")
            data = s.recv(4096)
            return b" 200 " in data.split(b"\r\n", 1)[0] + b" "
        except OSError:
            return False
        finally:
            s.close()

    def cli(self, *args: str, timeout: float = 300.0) -> str:
        """Run ``warren --addr <this daemon> ARGS`` and return its stdout."""
        out = subprocess.run(
            [self.binary, "--addr", self.addr, *args],
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        return out.stdout.decode()

    def build_busybox_image(self, name: str = "busybox") -> None:
        """Build the busybox image from the host's static busybox
        (``apt-get install busybox-static``)."""
        self.cli("image", "build", "busybox", name, "--tmp-dir", self.base_dir)

    def sandbox_ids(self) -> List[str]:
        out = self.cli("--json", "sandbox", "ls", timeout=60)
        try:
            d = json.loads(out or "{}")
        except ValueError:
            return []
        items = d.get("sandboxes", d) if isinstance(d, dict) else d
        return [s.get("id", "") for s in items or [] if isinstance(s, dict)]

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def restart(self, timeout: float = 30.0) -> "LocalDaemon":
        """Stop the daemon process (SIGTERM) and start it again on the same
        state: its sandboxes keep running and the new daemon adopts them,
        as after an upgrade or a crash of the daemon alone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Delete every sandbox, stop the daemon and remove its files and
        cgroups."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                ids = self.sandbox_ids()
                if ids:
                    subprocess.run(
                        [self.binary, "--addr", self.addr, "sandbox", "rm", *ids],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=300,
                    )
            except Exception:  # noqa: BLE001 - best effort before stopping
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        self._cleanup_cgroups()
        self._unmount_under(self.base_dir)
        if self.owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _cleanup_cgroups(self) -> None:
        for d in sorted(glob.glob(os.path.join("/sys/fs/cgroup", "*", self.cgroup_parent)) + glob.glob(
            os.path.join("/sys/fs/cgroup", self.cgroup_parent)
        ), key=len, reverse=True):
            for sub, _dirs, _files in sorted(os.walk(d, topdown=False), key=lambda t: -len(t[0])):
                try:
                    os.rmdir(sub)
                except OSError:
                    pass

    @staticmethod
    def _unmount_under(base: str) -> None:
        base = os.path.realpath(base)
        try:
            with open("/proc/self/mountinfo") as f:
                points = [urllib.parse.unquote(line.split()[4].replace("\\040", " ")) for line in f]
        except OSError:
            return
        for mp in sorted((p for p in points if p == base or p.startswith(base + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> "LocalDaemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
