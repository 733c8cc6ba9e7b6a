"""The E2B Python SDK's core flow, unchanged, against Warren."""

import os
import time
import uuid

import pytest
from e2b import Sandbox, CommandExitException, NotFoundException
from e2b.exceptions import SandboxException


def test_create_get_kill(template):
    s = Sandbox.create(template, timeout=120, metadata={"k": "v"}, envs={"FROM_CREATE": "yes"})
    try:
        assert s.sandbox_id.isalnum() and s.sandbox_id == s.sandbox_id.lower()
        info = s.get_info()
        assert info.sandbox_id == s.sandbox_id
        assert info.template_id == template
        assert info.metadata == {"k": "v"}
        assert info.state == "running"
        assert 100 < (info.end_at - info.started_at).total_seconds() <= 121
        assert s.is_running()
        # envVars of the create reach every command.
        assert s.commands.run("echo $FROM_CREATE").stdout == "yes\n"
    finally:
        assert s.kill() is True
    # Gone: a second kill says so, and connecting fails.
    assert Sandbox.kill(s.sandbox_id) is False
    with pytest.raises(Exception):
        Sandbox.connect(s.sandbox_id)


def test_bad_api_key(template):
    with pytest.raises(Exception) as ei:
        Sandbox.create(template, api_key="e2b_" + "0" * 40)
    assert "401" in str(ei.value) or "API key" in str(ei.value) or "X-API-Key" in str(ei.value)


def test_unknown_template():
    with pytest.raises(Exception):
        Sandbox.create("no-such-warren-image-" + uuid.uuid4().hex[:8])


def test_commands_run(sbx):
    r = sbx.commands.run("echo out; echo err >&2")
    assert r.exit_code == 0
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"
    # env and cwd
    r = sbx.commands.run("echo $A-$B; pwd", envs={"A": "1", "B": "two"}, cwd="/tmp")
    assert r.stdout == "1-two\n/tmp\n"
    # streamed output reaches the callbacks
    seen = []
    sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
    assert "".join(seen) == "1\n2\n3\n"
    # stdin is closed unless asked: cat ends at once
    assert sbx.commands.run("cat").stdout == ""


def test_commands_nonzero_exit_raises(sbx):
    with pytest.raises(CommandExitException) as ei:
        sbx.commands.run("echo partial; exit 7")
    assert ei.value.exit_code == 7
    assert ei.value.stdout == "partial\n"


def test_commands_timeout(sbx):
    start = time.monotonic()
    with pytest.raises(Exception) as ei:
        sbx.commands.run("sleep 30 & wait", timeout=2)
    assert time.monotonic() - start < 15
    # The call's deadline and the command's timeout are the same instant
    # (as under envd): the SDK's timeout error, or the command's end, killed
    # for its timeout, which reaches the SDK first in some runs (then a
    # CommandExitException whose error says so; older SDKs leave that out
    # of str()).
    err = ei.value
    text = (str(err) + " " + str(getattr(err, "error", "") or "")).lower()
    assert "timeout" in type(err).__name__.lower() or "timed out" in text or "deadline" in text, repr(err)
    # As with envd, the command's timeout kills it (and its children).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sbx.commands.list():
        time.sleep(0.2)
    assert sbx.commands.list() == []
    assert sbx.commands.run("ps | grep -c '[s]leep 30' || true").stdout.strip() == "0"


def test_background_kill_and_stdin(sbx):
    h = sbx.commands.run("sleep 300", background=True)
    assert h.pid > 0
    pids = [p.pid for p in sbx.commands.list()]
    assert h.pid in pids
    assert h.kill() is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code == -1
    assert h.pid not in [p.pid for p in sbx.commands.list()]
    # A killed process is gone: killing it again says so.
    assert sbx.commands.kill(999999) is False

    # stdin: what is sent reaches the process.
    h = sbx.commands.run("head -n1", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello\n")
    assert h.wait().stdout == "hello\n"
    # A stream of input, in order (StreamInput, a client stream).
    if hasattr(sbx.commands, "stream_input"):
        h = sbx.commands.run("head -n2", background=True, stdin=True)
        sbx.commands.stream_input(h.pid, [b"one\n", b"two\n"])
        assert h.wait().stdout == "one\ntwo\n"
    # Closing it ends cat (SDKs with close_stdin).
    if hasattr(sbx.commands, "close_stdin"):
        h = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "a\n")
        sbx.commands.close_stdin(h.pid)
        assert h.wait().stdout == "a\n"


def test_files(sbx):
    info = sbx.files.write("/tmp/dir/a.txt", "hello")
    assert info.path == "/tmp/dir/a.txt"
    assert sbx.files.read("/tmp/dir/a.txt") == "hello"
    assert sbx.files.exists("/tmp/dir/a.txt")
    assert not sbx.files.exists("/tmp/dir/none")
    with pytest.raises(NotFoundException):
        sbx.files.read("/tmp/dir/none")

    assert sbx.files.make_dir("/tmp/dir/sub/deeper") is True
    assert sbx.files.make_dir("/tmp/dir/sub/deeper") is False
    sbx.files.write("/tmp/dir/sub/b.txt", "b")
    names = sorted(e.name for e in sbx.files.list("/tmp/dir"))
    assert names == ["a.txt", "sub"]
    deep = sorted(e.path for e in sbx.files.list("/tmp/dir", depth=3))
    assert deep == ["/tmp/dir/a.txt", "/tmp/dir/sub", "/tmp/dir/sub/b.txt", "/tmp/dir/sub/deeper"]
    a = sbx.files.get_info("/tmp/dir/a.txt")
    assert a.size == 5 and a.type.value == "file"
    assert sbx.files.get_info("/tmp/dir/sub").type.value == "dir"

    moved = sbx.files.rename("/tmp/dir/a.txt", "/tmp/dir/c.txt")
    assert moved.path == "/tmp/dir/c.txt"
    assert not sbx.files.exists("/tmp/dir/a.txt")
    assert sbx.files.read("/tmp/dir/c.txt") == "hello"

    sbx.files.remove("/tmp/dir/sub")
    assert not sbx.files.exists("/tmp/dir/sub")
    # What the files API wrote, commands see.
    assert sbx.commands.run("cat /tmp/dir/c.txt").stdout == "hello"

    # Several files in one multipart upload.
    infos = sbx.files.write_files([
        {"path": "/tmp/m/one", "data": "1"},
        {"path": "/tmp/m/two", "data": b"2"},
    ])
    assert sorted(i.path for i in infos) == ["/tmp/m/one", "/tmp/m/two"]
    assert sbx.commands.run("cat /tmp/m/one /tmp/m/two").stdout == "12"


def test_files_binary(sbx):
    data = os.urandom(3 << 20) + bytes(range(256))
    sbx.files.write("/tmp/blob.bin", data)
    got = sbx.files.read("/tmp/blob.bin", format="bytes")
    assert bytes(got) == data
    # The octet-stream upload (a file-like entry) too.
    import io
    sbx.files.write("/tmp/blob2.bin", io.BytesIO(data))
    assert bytes(sbx.files.read("/tmp/blob2.bin", format="bytes")) == data
    r = sbx.commands.run("wc -c < /tmp/blob2.bin")
    assert int(r.stdout.strip()) == len(data)


def test_list_with_metadata(template):
    tag = uuid.uuid4().hex[:12]
    a = Sandbox.create(template, timeout=120, metadata={"run": tag, "role": "a"})
    b = Sandbox.create(template, timeout=120, metadata={"run": tag, "role": "b"})
    try:
        from e2b import SandboxQuery
        got = Sandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()
        assert sorted(s.sandbox_id for s in got) == sorted([a.sandbox_id, b.sandbox_id])
        only_b = Sandbox.list(query=SandboxQuery(metadata={"run": tag, "role": "b"})).next_items()
        assert [s.sandbox_id for s in only_b] == [b.sandbox_id]
        assert only_b[0].metadata == {"run": tag, "role": "b"}
        # Paging: one per page, X-Next-Token carries on.
        p = Sandbox.list(query=SandboxQuery(metadata={"run": tag}), limit=1)
        first = p.next_items()
        assert len(first) == 1 and p.has_next
        second = p.next_items()
        assert len(second) == 1
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        assert not p.has_next
    finally:
        a.kill()
        b.kill()


def test_set_timeout_expires(template):
    s = Sandbox.create(template, timeout=300)
    try:
        s.set_timeout(2)
        info = s.get_info()
        assert (info.end_at - info.started_at).total_seconds() < 60
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and s.is_running():
            time.sleep(0.5)
        assert not s.is_running()
        with pytest.raises(Exception):
            s.get_info()
    finally:
        Sandbox.kill(s.sandbox_id)


def test_pause_connect(template):
    s = Sandbox.create(template, timeout=300)
    try:
        s.files.write("/tmp/state.txt", "kept")
        h = s.commands.run("sleep 600", background=True)
        # Newer SDKs say True (paused) and False (already paused: 409);
        # older ones return the id or nothing either way.
        assert s.pause() in (True, None, s.sandbox_id)
        assert s.get_info().state == "paused"
        from e2b import SandboxQuery, SandboxState
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert s.sandbox_id in [x.sandbox_id for x in paused]
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert s.sandbox_id not in [x.sandbox_id for x in running]
        assert s.pause() in (False, None, s.sandbox_id)
        s2 = Sandbox.connect(s.sandbox_id)
        assert s2.get_info().state == "running"
        if "E2b-Sandbox-Id" not in s2.connection_config.sandbox_headers:
            # SDKs before 2.2x leave the id out of a connected handle's
            # envd headers (no E2B_SANDBOX_URL server can route those):
            # the original handle goes on.
            s2 = s
        assert s2.files.read("/tmp/state.txt") == "kept"
        assert h.pid in [p.pid for p in s2.commands.list()]
        assert s2.commands.run("echo back").stdout == "back\n"
        # Connecting to a running sandbox is fine too.
        Sandbox.connect(s.sandbox_id)
    finally:
        Sandbox.kill(s.sandbox_id)


def test_async_load_100(template):
    """100 sandboxes created, driven and killed concurrently through the
    SDK's async API."""
    import asyncio
    from e2b import AsyncSandbox

    n = int(os.environ.get("WARREN_E2B_LOAD", "100"))

    async def one(i):
        s = await AsyncSandbox.create(template, timeout=300, metadata={"load": "1"})
        try:
            r = await s.commands.run(f"echo {i}")
            assert r.stdout == f"{i}\n"
            await s.files.write(f"/tmp/{i}", str(i))
            assert await s.files.read(f"/tmp/{i}") == str(i)
        finally:
            await s.kill()

    async def main():
        return await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)

    start = time.monotonic()
    results = asyncio.run(main())
    took = time.monotonic() - start
    errors = [r for r in results if isinstance(r, BaseException)]
    print(f"\nload: {n} sandboxes created, driven and killed concurrently in {took:.1f}s")
    assert not errors, errors[:3]


def test_pty(sbx):
    from e2b.sandbox.commands.command_handle import PtySize

    h = sbx.pty.create(PtySize(rows=24, cols=80), timeout=30)
    sbx.pty.resize(h.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(h.pid, b"echo hi-$((6*7)); stty size; exit 3\n")
    out = []
    with pytest.raises(CommandExitException) as ei:
        h.wait(on_pty=out.append)
    assert ei.value.exit_code == 3
    text = b"".join(out)
    assert b"hi-42\r\n" in text and b"40 100\r\n" in text


def test_network(template):
    """allow_internet_access and allow_out/deny_out map onto Warren's
    network policies (open, none, allowlist), at create and through
    update_network."""
    closed = Sandbox.create(template, timeout=120, allow_internet_access=False)
    opened = Sandbox.create(template, timeout=120, allow_internet_access=True)
    try:
        # No network: loopback only. Open: a default route.
        assert "default" not in closed.commands.run("ip route || true").stdout
        assert "default" in opened.commands.run("ip route").stdout
        ci, oi = closed.get_info(), opened.get_info()
        if hasattr(ci, "allow_internet_access"):
            assert ci.allow_internet_access is False
            assert oi.allow_internet_access is True
        if not hasattr(opened, "update_network"):
            return  # older SDKs
        opened.update_network({"allow_out": ["10.9.9.9", "pypi.org"], "deny_out": ["0.0.0.0/0"]})
        net = opened.get_info().network
        assert sorted(net["allow_out"]) == ["10.9.9.9/32", "pypi.org"]
        assert net["deny_out"] == ["0.0.0.0/0"]
        # A deny list Warren cannot express is refused, not dropped.
        with pytest.raises(SandboxException):
            opened.update_network({"deny_out": ["10.0.0.0/8"]})
    finally:
        closed.kill()
        opened.kill()


# --- Ports other than envd's: get_host(port) ---------------------------------

def _door():
    """The address of Warren's E2B door (the test points the SDK at it)."""
    import urllib.parse

    u = urllib.parse.urlparse(os.environ["E2B_SANDBOX_URL"])
    return u.hostname, u.port


def _get(host, headers=None, path="/"):
    """GET path from the door with the given Host: (status, body)."""
    import http.client

    conn = http.client.HTTPConnection(*_door(), timeout=30)
    try:
        h = {"Host": host}
        h.update(headers or {})
        conn.request("GET", path, headers=h)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _read_until(s, want, have=b""):
    """Reads from socket s until want is in what was read (the socket's
    timeout bounds each read)."""
    buf = have
    while want not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise AssertionError(f"connection closed before {want!r}; read {buf!r}")
        buf += chunk
    return buf


# One HTTP exchange per connection (busybox nc -ll -e): an upgrade
# ("Upgrade: echo") switches protocols and echoes what it reads; any other
# request gets a streamed answer, "first", then "second" once /tmp/go
# exists.
_HANDLER = r"""#!/bin/sh
up=""
while read -r line; do
  line=$(printf %s "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in [Uu]pgrade:*) up=1;; esac
done
if [ -n "$up" ]; then
  printf 'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n'
  exec cat
fi
printf 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n'
echo first
i=0
while [ ! -e /tmp/go ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
echo second
"""


def test_get_host_ports(sbx):
    """A server in the sandbox is reached through Warren's E2B door by the
    host get_host(port) names and by E2b-Sandbox-Id with E2b-Sandbox-Port;
    streamed answers arrive as they are written and an upgraded connection
    (what a WebSocket is) carries bytes both ways; a port nothing listens
    on is 502 saying so, an unknown sandbox 404; the server answers again
    after a pause and connect."""
    import socket

    sbx.files.write("/tmp/www/index.html", "hello-port\n")
    sbx.commands.run("busybox httpd -f -p 8080 -h /tmp/www", background=True)
    host = sbx.get_host(8080)
    assert host.startswith(f"8080-{sbx.sandbox_id}.")
    deadline = time.monotonic() + 30
    while True:
        status, body = _get(host)
        if status == 200:
            break
        # 502 until httpd listens.
        assert status == 502 and time.monotonic() < deadline, (status, body)
        time.sleep(0.2)
    assert body == b"hello-port\n"
    status, body = _get("door", {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8080"}, "/index.html")
    assert (status, body) == (200, b"hello-port\n")

    status, body = _get(sbx.get_host(8099))
    assert status == 502 and b"nothing listens on port 8099" in body, (status, body)
    status, body = _get(f"8080-nosuch{uuid.uuid4().hex[:12]}.e2b.app")
    assert status == 404 and b"not found" in body, (status, body)

    sbx.files.write("/tmp/h.sh", _HANDLER)
    sbx.commands.run("chmod +x /tmp/h.sh")
    sbx.commands.run("busybox nc -ll -p 8081 -e /tmp/h.sh", background=True)
    up = f"GET /ws HTTP/1.1\r\nHost: {sbx.get_host(8081)}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n".encode()
    deadline = time.monotonic() + 30
    while True:
        s = socket.create_connection(_door(), timeout=30)
        s.sendall(up)
        head = _read_until(s, b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 101"):
            break
        s.close()
        assert head.startswith(b"HTTP/1.1 502") and time.monotonic() < deadline, head
        time.sleep(0.2)
    try:
        rest = head.split(b"\r\n\r\n", 1)[1]
        s.sendall(b"ping\n")
        assert _read_until(s, b"ping\n", rest).endswith(b"ping\n")
        s.sendall(b"pong\n")
        assert b"pong\n" in _read_until(s, b"pong\n")
    finally:
        s.close()

    s = socket.create_connection(_door(), timeout=30)
    try:
        s.sendall(f"GET / HTTP/1.1\r\nHost: {sbx.get_host(8081)}\r\n\r\n".encode())
        got = _read_until(s, b"first\n")
        assert got.startswith(b"HTTP/1.1 200") and b"second" not in got
        sbx.files.write("/tmp/go", "")
        _read_until(s, b"second\n", got)
    finally:
        s.close()

    # Pause ends the proxy's connections into the sandbox (kept for the
    # next request), and after connect its server answers again.
    sbx.pause()
    Sandbox.connect(sbx.sandbox_id)
    deadline = time.monotonic() + 30
    while _get(host) != (200, b"hello-port\n"):
        assert time.monotonic() < deadline, _get(host)
        time.sleep(0.2)


# The events a command's changes make in a watched directory, by name
# relative to it (a recursive watch follows the directory made inside).
WATCH_SCRIPT = ("echo a > {d}/f && chmod 600 {d}/f && mv {d}/f {d}/g && rm {d}/g"
                " && mkdir -p {d}/sub/deep && echo x > {d}/sub/deep/h")
WATCH_WANT = {("f", "create"), ("f", "write"), ("f", "chmod"), ("f", "rename"),
              ("g", "create"), ("g", "remove"), ("sub", "create"),
              ("sub/deep/h", "create")}


def test_watch_dir(sbx):
    """files.watch_dir (envd's watcher calls, which the sync SDK polls)
    reports what a command does in the directory; a stopped watcher is
    gone."""
    sbx.files.make_dir("/tmp/w")
    h = sbx.files.watch_dir("/tmp/w", recursive=True)
    try:
        sbx.commands.run(WATCH_SCRIPT.format(d="/tmp/w"))
        seen = set()
        deadline = time.monotonic() + 60
        while not WATCH_WANT <= seen and time.monotonic() < deadline:
            seen |= {(e.name, e.type.value) for e in h.get_new_events()}
            time.sleep(0.2)
        assert WATCH_WANT <= seen, WATCH_WANT - seen
    finally:
        h.stop()
    with pytest.raises(SandboxException):
        h.get_new_events()


def test_watch_dir_stream(template):
    """AsyncSandbox.files.watch_dir (envd's WatchDir stream): a start
    event, then the events, to on_event."""
    import asyncio
    from e2b import AsyncSandbox

    async def main():
        s = await AsyncSandbox.create(template, timeout=120)
        try:
            await s.files.make_dir("/tmp/ws")
            got = asyncio.Queue()
            h = await s.files.watch_dir("/tmp/ws", on_event=got.put_nowait, recursive=True)
            await s.commands.run(WATCH_SCRIPT.format(d="/tmp/ws"))
            seen = set()
            deadline = time.monotonic() + 60
            while not WATCH_WANT <= seen:
                e = await asyncio.wait_for(got.get(), timeout=max(0.1, deadline - time.monotonic()))
                seen.add((e.name, e.type.value))
            await h.stop()
        finally:
            await s.kill()

    asyncio.run(main())


def test_metrics(sbx):
    """get_metrics: one point, now, of the sandbox's CPU, memory and disk;
    none for a range that ended earlier."""
    import datetime

    sbx.commands.run("dd if=/dev/zero of=/tmp/m bs=1M count=4 2>/dev/null")
    ms = sbx.get_metrics()
    assert len(ms) == 1, ms
    m = ms[0]
    assert m.cpu_count >= 1 and 0 <= m.cpu_used_pct <= 100
    assert 0 < m.mem_used <= m.mem_total
    assert 0 < m.disk_used <= m.disk_total
    assert abs(m.timestamp.timestamp() - time.time()) < 120
    hour_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    assert sbx.get_metrics(end=hour_ago) == []
