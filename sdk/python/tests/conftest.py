"""Test fixtures: a real daemon for the whole session, clients, labels and a
leak check after every test.

The daemon is ``$WARREN_BIN`` or the repository's ``bin/warren`` (``make
build``); nothing is built here. It runs with private state, runtime and
socket directories under a temporary directory and its own cgroup parent,
gets a busybox image, and is stopped (its sandboxes deleted, its files and
cgroups removed) at the end.

Async tests (``async def test_...``) run in a fresh event loop each, with a
deadline (``@pytest.mark.timeout_s(N)``, default 180 s), through the
``pytest_pyfunc_call`` hook below: no pytest plugin is needed."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import sys
import uuid
from typing import Any, Dict, Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import warren  # noqa: E402
from warren.testing import LocalDaemon, find_warren_binary  # noqa: E402

IMAGE = "busybox"
TOKEN = uuid.uuid4().hex
SESSION = uuid.uuid4().hex[:12]
DEFAULT_TIMEOUT = 180.0


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "timeout_s(seconds): deadline of an async test")


@pytest.fixture(scope="session")
def daemon() -> Iterator[LocalDaemon]:
    if os.geteuid() != 0:
        pytest.skip("the daemon needs root (namespaces, mounts, cgroups)")
    binary = find_warren_binary(HERE)
    if not binary or not os.path.exists(binary):
        pytest.fail("no warren binary: run `make build` in the repository or set WARREN_BIN", pytrace=False)
    # Also on TCP (loopback only) with a bearer token, for the token tests.
    import socket
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = tempfile.mkdtemp(prefix="warren-py-")
    token_file = os.path.join(base, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    d = LocalDaemon(
        binary,
        base_dir=base,
        log_level="debug",
        extra_args=["--listen", f"127.0.0.1:{port}", "--token-file", token_file],
    )
    d.owns_dir = True
    d.tcp_addr = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    d.start()
    try:
        d.build_busybox_image(IMAGE)
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="session")
def addr(daemon: LocalDaemon) -> str:
    return daemon.addr


def _test_labels(nodeid: str) -> Dict[str, str]:
    return {"pytest-session": SESSION, "pytest-test": hashlib.sha1(nodeid.encode()).hexdigest()[:16]}


@pytest.fixture
def labels(request: Any) -> Dict[str, str]:
    """Labels for every sandbox of this test (the leak check looks for them)."""
    return _test_labels(request.node.nodeid)


@pytest.fixture
def w(addr: str, labels: Dict[str, str], request: Any) -> warren.AsyncWarren:
    """An AsyncWarren for this test (closed after it by the async runner)."""
    c = warren.AsyncWarren(addr, labels=labels)
    _clients(request.node).append(c)
    return c


@pytest.fixture
def sw(addr: str, labels: Dict[str, str]) -> Iterator[warren.Warren]:
    """The synchronous client."""
    c = warren.Warren(addr, labels=labels)
    try:
        yield c
    finally:
        c.close()


def _clients(node: Any) -> List[warren.AsyncWarren]:
    if not hasattr(node, "_warren_clients"):
        node._warren_clients = []
    return node._warren_clients  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _leak_check(request: Any) -> Iterator[None]:
    """Fail a test that leaves sandboxes behind (and delete them)."""
    if "addr" not in request.fixturenames:
        yield
        return
    addr = request.getfixturevalue("addr")
    labels = _test_labels(request.node.nodeid)
    yield

    async def check() -> List[str]:
        async with warren.AsyncWarren(addr) as c:
            left = await c.list(labels)
            for sb in left:
                await c.delete(sb.id, missing_ok=True)
            return [sb.id for sb in left]

    leaked = asyncio.run(check())
    assert not leaked, f"test leaked sandboxes: {leaked}"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> Any:
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        return None
    kwargs = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    m = pyfuncitem.get_closest_marker("timeout_s")
    timeout = float(m.args[0]) if m else DEFAULT_TIMEOUT

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(fn(**kwargs))
        expired = []

        def expire() -> None:
            expired.append(True)
            task.cancel()

        timer = loop.call_later(timeout, expire)
        try:
            await task
        except asyncio.CancelledError:
            if expired:
                raise AssertionError(f"test did not finish within {timeout:g}s") from None
            raise
        finally:
            timer.cancel()
            for c in _clients(pyfuncitem):
                await c.close()

    asyncio.run(run())
    return True


async def ps(sb: warren.AsyncSandbox) -> str:
    """The process list of a sandbox (busybox ps)."""
    r = await sb.exec(["ps", "-o", "pid,args"])
    return r.text


async def eventually(cond: Any, timeout: float = 10.0, interval: float = 0.1) -> bool:
    """Poll ``await cond()`` until it is true or ``timeout`` passes."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        if await cond():
            return True
        if loop.time() >= end:
            return False
        await asyncio.sleep(interval)


def pytest_report_header(config: Any) -> List[str]:
    import aiohttp

    return [f"warren SDK {warren.__version__} from {os.path.dirname(warren.__file__)}; aiohttp {aiohttp.__version__}"]
