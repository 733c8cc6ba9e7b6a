"""HTTP transport: the Connect protocol (JSON) over aiohttp, deadlines and
retries.

One aiohttp session (one connection pool) per client and event loop. Unary
RPCs are ``POST /warren.v1.<Service>/<Method>`` with a JSON body; server
streams use ``application/connect+json`` with 5-byte envelopes. Plain HTTP
endpoints (archives, image upload) share the pool, the deadlines and the
retry logic.

Deadlines: every call has one. It bounds all attempts and backoff sleeps
together, is enforced by aiohttp's timer (which closes the connection, so
the daemon sees the request go away and cancels the work) and is sent to the
daemon as ``Connect-Timeout-Ms`` so it gives up too.

Retries: see :class:`~warren.RetryPolicy`. A failure is *ambiguous* when the
request may have reached the daemon (the connection broke after it was
written, or the daemon answered ``unavailable``); only idempotent calls are
retried after an ambiguous failure. Errors raised on an attempt that follows
an ambiguous failure carry ``after_ambiguous_failure = True`` so callers can
tell "not found because our earlier attempt deleted it" from a real miss.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import urllib.parse
from types import SimpleNamespace
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Dict, Mapping, Optional, Tuple, TypeVar, Union

import aiohttp

from ._retry import NO_RETRY, RetryPolicy
from .errors import (
    TimeoutError as WarrenTimeoutError,
    UnavailableError,
    WarrenError,
    error_from_status,
)

__all__ = ["Transport", "parse_addr", "DEFAULT_ADDR", "ENV_ADDR", "ENV_TOKEN"]

DEFAULT_ADDR = "unix:///run/warren/warren.sock"
ENV_ADDR = "WARREN_ADDR"
ENV_TOKEN = "WARREN_TOKEN"
CATEGORY_HEADER = "Warren-Error-Category"

_END_STREAM = 0x02
_COMPRESSED = 0x01
_MAX_MESSAGE = 256 << 20

T = TypeVar("T")


def parse_addr(addr: str) -> Tuple[str, str, str]:
    """Split a daemon address into (network, target, base URL).

    Accepted forms: ``unix:///path/to.sock`` (or a bare absolute path),
    ``http://host:port``, ``https://host[:port]`` and ``host:port``."""
    if addr.startswith("/"):
        return "unix", addr, "http://warren"
    if addr.startswith("unix:"):
        rest = addr[len("unix:") :]
        if rest.startswith("//"):
            rest = rest[2:]
        if not rest:
            raise ValueError(f"bad daemon address {addr!r}: no socket path")
        return "unix", urllib.parse.unquote(rest), "http://warren"
    if addr.startswith("http://") or addr.startswith("https://"):
        u = urllib.parse.urlsplit(addr)
        if not u.netloc:
            raise ValueError(f"bad daemon address {addr!r}: no host")
        return u.scheme, u.netloc, f"{u.scheme}://{u.netloc}{u.path}".rstrip("/")
    if "://" in addr:
        raise ValueError(f"bad daemon address {addr!r}: unsupported scheme (want unix, http or https)")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad daemon address {addr!r}: want unix:///path, http://host:port or host:port")
    return "http", addr, "http://" + addr


class _Failure(Exception):
    """A transient failure of one attempt."""

    def __init__(self, error: WarrenError, sent: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.sent = sent  # the request may have reached the daemon


def _json_error(body: bytes) -> Dict[str, Any]:
    try:
        d = json.loads(body.decode("utf-8", "replace")) if body else {}
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _http_error(status: int, body: bytes, headers: Mapping[str, str], procedure: str) -> WarrenError:
    d = _json_error(body)
    msg = str(d.get("message") or "")
    if not msg and not d:
        msg = body.decode("utf-8", "replace").strip()[:500]
    category = d.get("category") or headers.get(CATEGORY_HEADER) or None
    code = d.get("code") or None
    return error_from_status(code, msg, category=category, http_status=status, procedure=procedure)


def _server_timeout_ms(remaining: float) -> str:
    """The deadline sent to the daemon: the client's, plus a grace period so
    that the client's own timer normally fires first (and closing the
    request cancels the work); the daemon's deadline is the backstop for
    when the disconnect does not reach it."""
    return str(int(remaining * 1000) + 1000)


def _is_transient(err: WarrenError) -> bool:
    return err.code == "unavailable" or err.http_status in (502, 503)


class Transport:
    """Connection pool, deadlines, retries and the wire formats."""

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        token: Optional[str] = None,
        max_connections: int = 512,
        retry: Optional[RetryPolicy] = None,
        user_agent: str = "warren-python",
        ssl: Any = None,
        keepalive_timeout: float = 30.0,
    ) -> None:
        addr = addr or os.environ.get(ENV_ADDR) or DEFAULT_ADDR
        if token is None:
            token = os.environ.get(ENV_TOKEN) or None
        self.addr = addr
        self.network, self.target, self.base_url = parse_addr(addr)
        self.retry = retry if retry is not None else RetryPolicy()
        self.max_connections = max_connections
        self._ssl = ssl
        self._keepalive = keepalive_timeout
        headers = {"User-Agent": user_agent, "Connect-Protocol-Version": "1"}
        if self.network == "unix":
            # Compressing over a local socket only burns CPU on both sides.
            headers["Accept-Encoding"] = "identity"
        if token:
            headers["Authorization"] = "Bearer " + token
        self._headers = headers
        self._unary_headers = dict(headers, **{"Content-Type": "application/json"})
        self._stream_headers = dict(headers, **{"Content-Type": "application/connect+json"})
        self._session: Optional[aiohttp.ClientSession] = None
        self._traced: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False

    # -- session --------------------------------------------------------

    def _session_for_loop(self, traced: bool = False) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A session of another (finished) loop cannot be closed from
            # here; it is dropped.
            self._session = self._traced = None
        if traced:
            t = self._traced
            if t is None or t.closed:
                if self._closed:
                    raise UnavailableError("the client is closed")
                t = self._traced = self._new_session(traced=True)
                self._loop = loop
            return t
        s = self._session
        if s is not None and not s.closed:
            return s
        if self._closed:
            raise UnavailableError("the client is closed")
        s = self._session = self._new_session(traced=False)
        self._loop = loop
        return s

    def _new_session(self, traced: bool) -> aiohttp.ClientSession:
        connector: aiohttp.BaseConnector
        if self.network == "unix":
            connector = aiohttp.UnixConnector(
                path=self.target, limit=self.max_connections, keepalive_timeout=self._keepalive
            )
        else:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections,
                keepalive_timeout=self._keepalive,
                ssl=self._ssl if self._ssl is not None else True,
            )
        trace_configs = []
        if traced:
            # Tells a call whether its request may have left the client
            # (see unary(sent=...)).
            tc = aiohttp.TraceConfig()

            async def on_sent(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
                flag = getattr(ctx, "trace_request_ctx", None)
                if flag is not None:
                    flag.sent = True

            tc.on_request_headers_sent.append(on_sent)
            trace_configs.append(tc)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("Content-Type",),
            trace_configs=trace_configs or None,
        )
        # Newer aiohttp versions silently resend a GET/PUT/DELETE once when
        # a reused connection breaks, with the same (by then consumed)
        # streamed body: an upload would arrive empty. Retries are this
        # module's job, with a fresh body per attempt, so turn that off.
        if hasattr(session, "_retry_connection"):
            session._retry_connection = False
        return session
        return self._session

    async def close(self) -> None:
        self._closed = True
        sessions = [self._session, self._traced]
        self._session = self._traced = None
        for s in sessions:
            if s is not None and not s.closed:
                try:
                    if self._loop is asyncio.get_running_loop():
                        await s.close()
                except RuntimeError:
                    pass

    # -- the retry loop -------------------------------------------------

    async def _with_retries(
        self,
        procedure: str,
        attempt_fn: Callable[[float], Awaitable[T]],
        *,
        timeout: float,
        idempotent: bool,
        retry: Optional[RetryPolicy],
    ) -> T:
        loop = asyncio.get_running_loop()
        policy = retry if retry is not None else self.retry
        deadline = loop.time() + timeout
        attempt = 0
        ambiguous = False
        while True:
            attempt += 1
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise WarrenTimeoutError(
                    f"{procedure}: client deadline of {timeout:g}s passed", timeout=timeout, procedure=procedure
                )
            try:
                return await attempt_fn(remaining)
            except asyncio.TimeoutError as e:
                if isinstance(e, WarrenError):
                    raise
                raise WarrenTimeoutError(
                    f"{procedure}: client deadline of {timeout:g}s passed", timeout=timeout, procedure=procedure
                ) from None
            except _Failure as f:
                err = f.error
                err.after_ambiguous_failure = ambiguous
                ambiguous = ambiguous or f.sent
                if attempt >= policy.max_attempts or (f.sent and not idempotent):
                    raise err from None
                delay = policy.backoff(attempt)
                if loop.time() + delay >= deadline:
                    raise err from None
                await asyncio.sleep(delay)
            except WarrenError as err:
                err.after_ambiguous_failure = ambiguous
                raise

    def _classify(self, exc: BaseException, procedure: str) -> _Failure:
        """Turn an aiohttp/OS exception into a transient failure."""
        if isinstance(exc, aiohttp.ClientConnectorError):
            return _Failure(UnavailableError(f"{procedure}: cannot connect to {self.addr}: {exc}", code="unavailable", procedure=procedure), sent=False)
        return _Failure(
            UnavailableError(f"{procedure}: connection to {self.addr} failed: {type(exc).__name__}: {exc}", code="unavailable", procedure=procedure),
            sent=True,
        )

    # -- unary RPCs -----------------------------------------------------

    async def unary(
        self,
        procedure: str,
        body: Mapping[str, Any],
        *,
        timeout: float,
        idempotent: bool,
        retry: Optional[RetryPolicy] = None,
        sent: Optional[SimpleNamespace] = None,
        again: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        """Call ``procedure`` (e.g. ``"warren.v1.SandboxService/Get"``).

        ``sent``, when given, gets ``sent.sent = True`` as soon as a request
        of the call may have left the client (its headers were written).
        ``again``, when given, is the body of the attempts after the first
        (a create marks itself a retry)."""
        data = json.dumps(body, separators=(",", ":")).encode()
        data_again = data if again is None else json.dumps(again, separators=(",", ":")).encode()
        url = f"{self.base_url}/{procedure}"
        extra: Dict[str, Any] = {} if sent is None else {"trace_request_ctx": sent}
        attempts = 0

        async def attempt(remaining: float) -> Dict[str, Any]:
            nonlocal attempts
            payload = data if attempts == 0 else data_again
            attempts += 1
            session = self._session_for_loop(traced=sent is not None)
            headers = dict(self._unary_headers)
            headers["Connect-Timeout-Ms"] = _server_timeout_ms(remaining)
            try:
                async with session.post(
                    url, data=payload, headers=headers, timeout=aiohttp.ClientTimeout(total=remaining), **extra
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
                    if status != 200:
                        err = _http_error(status, raw, resp.headers, procedure)
                        if _is_transient(err):
                            raise _Failure(err, sent=True)
                        raise err
            except (asyncio.TimeoutError, _Failure, WarrenError, asyncio.CancelledError):
                raise
            except (aiohttp.ClientError, OSError) as e:
                raise self._classify(e, procedure) from e
            try:
                out = json.loads(raw) if raw else {}
            except ValueError as e:
                raise _Failure(
                    UnavailableError(f"{procedure}: bad response body: {e}", code="unavailable", procedure=procedure),
                    sent=True,
                ) from e
            return out if isinstance(out, dict) else {}

        return await self._with_retries(procedure, attempt, timeout=timeout, idempotent=idempotent, retry=retry)

    # -- server streams ---------------------------------------------------

    async def server_stream(
        self,
        procedure: str,
        body: Mapping[str, Any],
        *,
        timeout: float,
        idempotent: bool,
        retry: Optional[RetryPolicy] = None,
    ) -> AsyncGenerator[Dict[str, Any], None]:
        """Call a server-streaming RPC and yield its messages.

        The deadline covers the whole stream. A failure before the first
        message is retried like a unary call; once a message was yielded
        the stream is never restarted. Closing the generator closes the
        HTTP request, which cancels the call on the daemon."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        data = struct.pack(">BI", 0, len(payload)) + payload
        url = f"{self.base_url}/{procedure}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        async def attempt(remaining: float) -> Tuple[aiohttp.ClientResponse, Any]:
            session = self._session_for_loop()
            headers = dict(self._stream_headers)
            headers["Connect-Timeout-Ms"] = _server_timeout_ms(remaining)
            ctx = session.post(url, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=remaining))
            try:
                resp = await ctx.__aenter__()
            except (asyncio.TimeoutError, asyncio.CancelledError):
                raise
            except (aiohttp.ClientError, OSError) as e:
                raise self._classify(e, procedure) from e
            try:
                if resp.status != 200:
                    raw = await resp.read()
                    err = _http_error(resp.status, raw, resp.headers, procedure)
                    if _is_transient(err):
                        raise _Failure(err, sent=True)
                    raise err
                # Wait for the first envelope here, so that a failure before
                # any message is retried.
                first = await self._read_envelope(resp, procedure)
            except BaseException as e:
                await ctx.__aexit__(type(e), e, e.__traceback__)
                if isinstance(e, (asyncio.TimeoutError, asyncio.CancelledError, _Failure)):
                    raise
                if isinstance(e, UnavailableError):
                    raise _Failure(e, sent=True) from None
                if isinstance(e, (aiohttp.ClientError, OSError)):
                    raise self._classify(e, procedure) from e
                raise
            return resp, (ctx, first)

        resp, (ctx, first) = await self._with_retries(
            procedure, attempt, timeout=timeout, idempotent=idempotent, retry=retry
        )
        exc_info: Tuple[Any, Any, Any] = (None, None, None)
        try:
            msg: Optional[Dict[str, Any]] = first
            while msg is not None:
                yield msg
                msg = await self._read_envelope(resp, procedure)
        except asyncio.TimeoutError as e:
            exc_info = (type(e), e, e.__traceback__)
            if isinstance(e, WarrenError):
                raise
            raise WarrenTimeoutError(
                f"{procedure}: client deadline of {timeout:g}s passed", timeout=timeout, procedure=procedure
            ) from None
        except (aiohttp.ClientError, OSError) as e:
            exc_info = (type(e), e, e.__traceback__)
            if loop.time() >= deadline:
                raise WarrenTimeoutError(
                    f"{procedure}: client deadline of {timeout:g}s passed", timeout=timeout, procedure=procedure
                ) from None
            raise self._classify(e, procedure).error from e
        except BaseException as e:
            exc_info = (type(e), e, e.__traceback__)
            raise
        finally:
            await ctx.__aexit__(*exc_info)

    async def _read_envelope(self, resp: aiohttp.ClientResponse, procedure: str) -> Optional[Dict[str, Any]]:
        """Read one envelope: a message (returned), or the end of the stream
        (None, or the error it carries is raised)."""
        try:
            head = await resp.content.readexactly(5)
        except asyncio.IncompleteReadError as e:
            raise UnavailableError(
                f"{procedure}: stream ended without an end-of-stream message", code="unavailable", procedure=procedure
            ) from e
        flags, size = struct.unpack(">BI", head)
        if size > _MAX_MESSAGE:
            raise UnavailableError(f"{procedure}: stream message of {size} bytes is too large", procedure=procedure)
        try:
            raw = await resp.content.readexactly(size) if size else b""
        except asyncio.IncompleteReadError as e:
            raise UnavailableError(f"{procedure}: stream cut in the middle of a message", code="unavailable", procedure=procedure) from e
        if flags & _COMPRESSED:
            raise UnavailableError(f"{procedure}: compressed stream message not negotiated", procedure=procedure)
        d = _json_error(raw)
        if flags & _END_STREAM:
            err = d.get("error")
            if err:
                meta = d.get("metadata") or {}
                cats = meta.get(CATEGORY_HEADER) or meta.get(CATEGORY_HEADER.lower()) or []
                cat = cats[0] if isinstance(cats, list) and cats else (cats if isinstance(cats, str) else None)
                raise error_from_status(err.get("code"), str(err.get("message") or ""), category=cat, procedure=procedure)
            return None
        return d

    # -- plain HTTP endpoints -------------------------------------------

    async def http(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, str]] = None,
        body: Optional[Callable[[], Any]] = None,
        content_type: Optional[str] = None,
        handle: Optional[Callable[[aiohttp.ClientResponse], Awaitable[T]]] = None,
        timeout: float,
        idempotent: bool,
        retry: Optional[RetryPolicy] = None,
    ) -> Union[T, bytes]:
        """A plain HTTP request. ``body`` makes a fresh request body per
        attempt; ``handle`` consumes a successful response (it must cope
        with being called again on a retry), otherwise the body is returned."""
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        procedure = f"{method} {path}"

        async def attempt(remaining: float) -> Union[T, bytes]:
            session = self._session_for_loop()
            headers = dict(self._headers)
            if content_type:
                headers["Content-Type"] = content_type
            try:
                async with session.request(
                    method,
                    url,
                    data=body() if body is not None else None,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    if resp.status // 100 != 2:
                        raw = await resp.read()
                        err = _http_error(resp.status, raw, resp.headers, procedure)
                        if _is_transient(err):
                            raise _Failure(err, sent=True)
                        raise err
                    if handle is not None:
                        return await handle(resp)
                    return await resp.read()
            except (asyncio.TimeoutError, _Failure, WarrenError, asyncio.CancelledError):
                raise
            except (aiohttp.ClientError, OSError) as e:
                raise self._classify(e, procedure) from e

        return await self._with_retries(procedure, attempt, timeout=timeout, idempotent=idempotent, retry=retry)


__all__ += ["NO_RETRY"]
