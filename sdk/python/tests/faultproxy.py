"""A small HTTP/1.1-aware unix socket proxy that injects faults between the
client and the daemon.

Each client connection gets its own upstream connection. Requests are
framed (head + Content-Length or chunked body) so rules can act on
individual requests of a keep-alive connection; responses are piped back
as raw bytes. Rules match an exact request path and fire a number of times:

- ``drop_response``: forward the request, then cut both connections as soon
  as the daemon starts answering (the work was done, the answer is lost);
- ``reset``: cut the connection without forwarding the request;
- ``blackhole``: swallow the request and never answer;
- ``status``: answer with an HTTP error (default 503 ``unavailable``; 501 is
  ``unimplemented``/``unsupported``)
  without forwarding.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import List, Optional, Set, Tuple


@dataclass
class Rule:
    kind: str
    path: str
    times: int = 1
    status: int = 503
    fired: int = 0

    def take(self, path: str) -> bool:
        if path != self.path or self.fired >= self.times:
            return False
        self.fired += 1
        return True


@dataclass
class FaultProxy:
    upstream: str
    path: str
    rules: List[Rule] = field(default_factory=list)
    #: (method, path) of every request seen, in order.
    seen: List[Tuple[str, str]] = field(default_factory=list)
    #: (path, raw request: headers and body) of every request seen, in order.
    raw: List[Tuple[str, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server: Optional[asyncio.AbstractServer] = None
        self._conns: Set["asyncio.Task[None]"] = set()

    @property
    def addr(self) -> str:
        return "unix://" + self.path

    def add(self, kind: str, path: str, times: int = 1, status: int = 503) -> Rule:
        r = Rule(kind, path, times, status)
        self.rules.append(r)
        return r

    def count(self, path: str) -> int:
        return sum(1 for _, p in self.seen if p == path)

    async def start(self) -> "FaultProxy":
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._handle, path=self.path)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if os.path.exists(self.path):
            os.unlink(self.path)

    async def __aenter__(self) -> "FaultProxy":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        uwriter: Optional[asyncio.StreamWriter] = None
        pump: Optional["asyncio.Task[None]"] = None
        drop_next = asyncio.Event()
        try:
            while True:
                req = await _read_request(creader)
                if req is None:
                    return
                method, path, raw = req
                self.seen.append((method, path))
                self.raw.append((path, raw))
                rule = next((r for r in self.rules if r.take(path)), None)
                kind = rule.kind if rule else "forward"
                if kind == "reset":
                    return
                if kind == "blackhole":
                    await creader.read()  # until the client gives up
                    return
                if kind == "status":
                    assert rule is not None
                    # 501 is what a backend that cannot do the call answers
                    code, cat = ("unimplemented", "unsupported") if rule.status == 501 else ("unavailable", "unavailable")
                    body = json.dumps({"code": code, "message": "injected fault"}).encode()
                    cwriter.write(
                        b"HTTP/1.1 %d Injected\r\nContent-Type: application/json\r\n"
                        b"Warren-Error-Category: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                        % (rule.status, cat.encode(), len(body))
                        + body
                    )
                    await cwriter.drain()
                    return
                if uwriter is None:
                    ureader, uwriter = await asyncio.open_unix_connection(self.upstream)
                    pump = asyncio.ensure_future(self._pump(ureader, cwriter, drop_next))
                if kind == "drop_response":
                    drop_next.set()
                uwriter.write(raw)
                await uwriter.drain()
                if pump is not None and pump.done():
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if pump is not None:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
            for w in (cwriter, uwriter):
                if w is not None:
                    w.close()
            self._conns.discard(task)

    async def _pump(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter, drop_next: asyncio.Event) -> None:
        try:
            while True:
                data = await ureader.read(65536)
                if not data:
                    break
                if drop_next.is_set():
                    break  # the answer is lost: cut the client off
                cwriter.write(data)
                await cwriter.drain()
        except ConnectionError:
            pass
        finally:
            cwriter.close()


async def _read_request(r: asyncio.StreamReader) -> Optional[Tuple[str, str, bytes]]:
    """Read one HTTP/1.1 request; None at a clean end of the connection."""
    try:
        head = await r.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    path = target.split("?", 1)[0]
    length = 0
    chunked = False
    for line in lines[1:]:
        k, _, v = line.partition(":")
        k = k.strip().lower()
        if k == "content-length":
            length = int(v.strip())
        elif k == "transfer-encoding" and "chunked" in v.lower():
            chunked = True
    body = b""
    if chunked:
        parts = []
        while True:
            size_line = await r.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            chunk = await r.readexactly(size + 2)
            parts.append(size_line + chunk)
            if size == 0:
                break
        body = b"".join(parts)
    elif length:
        body = await r.readexactly(length)
    return method, path, head + body
