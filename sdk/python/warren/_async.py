"""The asyncio client: AsyncWarren, AsyncSandbox, AsyncProcess, ExecStream
and AsyncSandboxGroup. The synchronous twin (warren._sync) runs this very
code on a private event loop thread."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import math
import os
import posixpath
import signal as _signal
import urllib.parse
import uuid
import warnings
from types import SimpleNamespace
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    BinaryIO,
    Callable,
    Dict,
    Generator,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

import aiohttp

if TYPE_CHECKING:  # pragma: no cover
    from ._sync import Sandbox
    from .rollout import Rollout

from . import _archive
from ._retry import RetryPolicy
from ._transport import Transport
from ._types import (
    ByLabelEvent,
    ByLabelResult,
    DownloadStats,
    ExecEvent,
    ExecResult,
    FileEvent,
    FileInfo,
    Image,
    Layer,
    LayerStat,
    LayerVerification,
    ProcessEvent,
    ProcessInfo,
    PauseResult,
    Screenshot,
    InputEvent,
    HibernateResult,
    PullEvent,
    Resources,
    ResumeResult,
    NetworkArg,
    Rlimit,
    RlimitsArg,
    RunResult,
    SandboxInfo,
    SandboxStats,
    SecurityEvent,
    SandboxState,
    Step,
    NodeStatus,
    VersionInfo,
    _int,
    _network_json,
    _rlimit_list,
)
from .batch import BatchResult, Outcome, gather_bounded, map_bounded
from .errors import (
    AlreadyExistsError,
    BatchError,
    CommandError,
    ConflictError,
    InternalError,
    NotFoundError,
    OutputTruncatedWarning,
    TimeoutError,
    UnavailableError,
    WarrenError,
    error_from_status,
)

__all__ = [
    "AsyncWarren",
    "AsyncSandbox",
    "AsyncProcess",
    "ProcessAttach",
    "ExecStream",
    "ImagePull",
    "AsyncSandboxGroup",
    "ExecJob",
    "Command",
    "CREATE_NONCE_LABEL",
]

log = logging.getLogger("warren")

T = TypeVar("T")

#: A command: a shell string (run with ``/bin/sh -c``) or an argv list.
Command = Union[str, Sequence[str]]
PathLike = Union[str, "os.PathLike[str]"]
Data = Union[bytes, bytearray, memoryview, str]
#: What an upload of a tarball takes: a local directory (tarred by the
#: client), a local tarball (plain or gzipped), tar bytes, or a binary file.
TarSource = Union[PathLike, bytes, bytearray, memoryview, BinaryIO]
#: Image or layer names: one name, several, or None for all.
Names = Union[str, Iterable[str], None]
#: A pull progress callback; it may also be a coroutine function.
PullProgress = Callable[[PullEvent], object]
#: Where a streamed download goes: a local path (created or truncated) or a
#: binary file object open for writing.
Sink = Union[PathLike, BinaryIO]

_SBX = "warren.v1.SandboxService/"
_IMG = "warren.v1.ImageService/"
_SYS = "warren.v1.SystemService/"

#: Label set on sandboxes created with an explicit id, so that a retried
#: create can tell its own sandbox (made by an attempt whose answer was lost)
#: from somebody else's with the same id.
CREATE_NONCE_LABEL = "warren-sdk.create-nonce"

# write_file sends larger contents as a one-file tar over the archive
# endpoint (a streamed, retry-safe upload) instead of a single JSON message.
_WRITE_INLINE_MAX = 32 << 20
# Bytes asked for per ReadFile call: the answer is base64 in JSON, so a
# client holds about 4x this while decoding one (64 MiB calls made a 2 GiB
# read_file peak at 4.2 GiB, issue 18).
_READ_CHUNK = 8 << 20
#: Default caps of the calls that return a whole file or archive in memory.
READ_MAX_BYTES = 256 << 20


def _job_steps(command: Any, steps: Optional[Sequence[Step]], options: Mapping[str, Any]) -> List[Step]:
    """The steps of a job given as a command with options, a Step, or steps."""
    if steps is not None:
        if command is not None or options:
            raise ValueError("give a command with step options, or steps, not both")
        return list(steps)
    if isinstance(command, Step):
        return [command]
    if isinstance(command, (list, tuple)) and command and all(isinstance(s, Step) for s in command):
        return list(command)
    if command is None:
        raise ValueError("a job needs a command or steps")
    return [Step(command, **options)]


def _new_id() -> str:
    """A random sandbox id: 16 characters of [a-z2-7] (80 bits)."""
    return base64.b32encode(os.urandom(10)).decode("ascii").lower()


def _ms(seconds: float) -> str:
    return str(max(1, int(math.ceil(seconds * 1000))))


def _b64(data: Data) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return base64.b64encode(bytes(data)).decode("ascii")


def _set_command(body: Dict[str, Any], command: Command) -> None:
    if isinstance(command, str):
        if not command:
            raise ValueError("empty command")
        body["shell"] = command
        return
    if isinstance(command, (bytes, bytearray)):
        raise TypeError("command must be a str (shell) or a sequence of str (argv), not bytes")
    argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in command]
    if not argv:
        raise ValueError("empty argv")
    body["argv"] = argv


def _names(names: Names) -> List[str]:
    if names is None:
        return []
    if isinstance(names, str):
        return [names]
    out = [str(n) for n in names]
    if any(not n for n in out):
        raise ValueError("empty image or layer name")
    return out


def _quote_name(name: str) -> str:
    """An image or layer name as a URL path (names may hold ``/`` and ``:``;
    anything else that URLs treat specially reaches the daemon as is, to be
    refused there)."""
    return urllib.parse.quote(name, safe="/:")


def _layer_list(layers: Optional[Sequence[str]]) -> List[str]:
    if layers is None:
        return []
    if isinstance(layers, (str, bytes)):
        raise TypeError("layers must be a sequence of layer names, not a single string")
    out = [str(x) for x in layers]
    if any(not x for x in out):
        raise ValueError("empty layer name")
    return out


def _positive(name: str, v: float) -> float:
    if not (v > 0) or math.isinf(v):
        raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
    return float(v)


async def _finish_despite_cancel(aw: Awaitable[T], limit: float) -> T:
    """Await ``aw`` to completion even if the caller is cancelled meanwhile
    (for at most ``limit`` seconds), then re-raise the cancellation.

    This is what makes ``async with`` clean up on cancellation: the delete
    runs in its own task, which a second cancellation of the caller (for
    example asyncio.run cancelling everything on Ctrl-C) does not abort."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    end = loop.time() + limit
    cancelled = False
    while not task.done():
        left = end - loop.time()
        if left <= 0:
            task.cancel()
            break
        try:
            await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.done():
            task.add_done_callback(_consume)
        raise asyncio.CancelledError()
    if not task.done():
        task.add_done_callback(_consume)
        raise TimeoutError(f"clean-up did not finish within {limit:g}s", timeout=limit)
    return task.result()


def _consume(task: "asyncio.Future[Any]") -> None:
    if not task.cancelled():
        task.exception()


# ---------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------


class AsyncWarren:
    """An asyncio client of one Warren daemon.

    One client (one connection pool) per process is enough for thousands
    of concurrent calls. Use it as an async context manager, or call
    :meth:`close`::

        async with AsyncWarren() as w:              # $WARREN_ADDR or the default socket
            async with w.create(image="busybox") as sb:
                r = await sb.exec("echo hello")
                print(r.text)

    Args:
        addr: ``unix:///path.sock`` (or a bare absolute path), ``http://host:port``,
            ``https://...``. Default: ``$WARREN_ADDR`` or ``unix:///run/warren/warren.sock``.
        token: bearer token for TCP listeners (default ``$WARREN_TOKEN``).
        labels: labels added to every sandbox this client creates, e.g.
            ``{"job": "run-42"}``; ``delete_all(labels=...)`` then reaps the
            orphans of a crashed run.
        timeout: default client deadline of ordinary calls, in seconds.
        create_timeout: default deadline of ``create``.
        exec_timeout: default command timeout of ``exec`` (sent to the daemon,
            which kills the command when it passes) and of ``Process.wait``.
        deadline_margin: added to a command's timeout to form the client
            deadline of ``exec``/``wait``, so that the daemon's timeout
            normally fires first and returns a ``timed_out`` result.
        transfer_timeout: default deadline of uploads, downloads and image imports.
        max_connections: connection pool size. Over HTTP/1.1 every call in
            flight holds a connection; calls beyond the limit wait for one
            (their deadline runs while they wait).
        retry: the :class:`RetryPolicy` of transient failures.
        on_truncation: what to do when an exec's output was cut at its limit:
            ``"warn"`` (an :class:`OutputTruncatedWarning`), ``"raise"``
            (:class:`CommandError`) or ``"ignore"``.
    """

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        token: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        timeout: float = 60.0,
        create_timeout: float = 300.0,
        exec_timeout: float = 600.0,
        deadline_margin: float = 15.0,
        transfer_timeout: float = 600.0,
        max_connections: int = 512,
        retry: Optional[RetryPolicy] = None,
        on_truncation: str = "warn",
        user_agent: str = "warren-python",
        ssl: Any = None,
    ) -> None:
        if on_truncation not in ("warn", "raise", "ignore"):
            raise ValueError("on_truncation must be 'warn', 'raise' or 'ignore'")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self._t = Transport(
            addr, token=token, max_connections=max_connections, retry=retry, user_agent=user_agent, ssl=ssl
        )
        self.labels: Dict[str, str] = dict(labels or {})
        self.timeout = _positive("timeout", timeout)
        self.create_timeout = _positive("create_timeout", create_timeout)
        self.exec_timeout = _positive("exec_timeout", exec_timeout)
        self.deadline_margin = float(deadline_margin)
        self.transfer_timeout = _positive("transfer_timeout", transfer_timeout)
        self.on_truncation = on_truncation

    @property
    def addr(self) -> str:
        """The daemon address."""
        return self._t.addr

    @property
    def retry(self) -> RetryPolicy:
        return self._t.retry

    @property
    def max_connections(self) -> int:
        return self._t.max_connections

    async def __aenter__(self) -> "AsyncWarren":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool. Sandboxes are left alone."""
        await self._t.close()

    def __repr__(self) -> str:
        return f"<AsyncWarren {self.addr}>"

    # -- low-level call helpers ------------------------------------------

    async def _rpc(
        self,
        method: str,
        body: Mapping[str, Any],
        *,
        timeout: Optional[float] = None,
        idempotent: bool = True,
        retry: Optional[RetryPolicy] = None,
    ) -> Dict[str, Any]:
        return await self._t.unary(
            method, body, timeout=timeout if timeout is not None else self.timeout, idempotent=idempotent, retry=retry
        )

    def _exec_deadline(self, command_timeout: float) -> float:
        return max(0.001, command_timeout + self.deadline_margin)

    def _check_truncation(self, r: ExecResult, command: Any) -> None:
        if not r.truncated or self.on_truncation == "ignore":
            return
        msg = (
            f"output of {command!r} was truncated at the output limit "
            f"(stdout dropped {r.stdout_dropped_bytes} bytes, stderr dropped {r.stderr_dropped_bytes} bytes); "
            "raise output_limit or write large output to a file"
        )
        if self.on_truncation == "raise":
            raise CommandError(msg, r)
        warnings.warn(msg, OutputTruncatedWarning, stacklevel=4)

    # -- sandboxes -------------------------------------------------------

    def create(
        self,
        image: str,
        *,
        id: Optional[str] = None,
        backend: Optional[str] = None,
        resources: Optional[Resources] = None,
        cpu_millis: int = 0,
        memory_bytes: int = 0,
        pids_max: int = 0,
        disk_bytes: int = 0,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        hostname: Optional[str] = None,
        layers: Optional[Sequence[str]] = None,
        user: Optional[str] = None,
        keep_etc: bool = False,
        allow_setuid: bool = False,
        user_namespace: Optional[bool] = None,
        rlimits: Optional[RlimitsArg] = None,
        network: Optional[NetworkArg] = None,
        harness: bool = False,
        max_children: int = 0,
        call_timeout: Optional[float] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> "_StartContext[AsyncSandbox]":
        """Create a sandbox. Await it for an :class:`AsyncSandbox`, or use it
        as an async context manager, which deletes the sandbox on exit (also
        on exceptions and cancellation)::

            sb = await w.create("busybox")
            async with w.create("busybox", memory_bytes=256 << 20) as sb: ...

        Args:
            image: image name.
            id: sandbox id (``[a-z0-9][a-z0-9_.-]{0,62}``). When None the client
                generates a random one, so the create is always safe to
                retry and a cancelled create never leaks a sandbox.
            backend: ``"container"`` (the default), or ``"fncall"``: taken
                ready-made from a pool of the image's environments (faster
                where the node has idle CPU; cannot hibernate or fork).
            resources: limits; or give ``cpu_millis`` (1000 = one core),
                ``memory_bytes``, ``pids_max`` and ``disk_bytes`` (the writable
                layer's size, at least 16 MiB) directly. 0 = node default.
            env: environment of every command.
            workdir: default working directory of commands.
            labels: merged over the client's ``labels``.
            timeout_seconds: the sandbox's lifetime; the daemon deletes it
                when it passes (0/None = node default, 1 h). See
                :meth:`AsyncSandbox.extend_timeout`.
            hostname: a DNS name; defaults to the id (``_`` made ``-``).
            keep_etc: keep the image's ``/etc/hosts``, ``/etc/hostname`` and
                ``/etc/resolv.conf``; by default the sandbox gets its own
                (localhost and its hostname; no nameserver without a network).
            allow_setuid: let setuid binaries and file capabilities work
                (``sudo`` as a non-root user of the image): the sandbox's
                processes run without ``no_new_privs``; the seccomp filter
                stays. Off by default.
            user_namespace: run the sandbox in a user namespace, root inside
                being an unprivileged host id (``True``), or not (``False``);
                ``None`` takes the node's default (``warren serve --userns``).
                The image's files must be owned by ids below 65,536.
            rlimits: resource limits of every process, over the defaults of a
                Debian 12 machine (nofile 1024:524288, stack 8 MiB soft, core 0
                soft, memlock 8 MiB, the rest mostly unlimited; lowered to the
                daemon's own hard limits): ``{"nofile": (1024, 4096), "core":
                Rlimit.UNLIMITED}`` (an int is soft and hard), or a sequence of
                :class:`Rlimit`. The sandbox's ``info.rlimits`` says what it
                got. A hard limit above the daemon's own is
                :class:`InvalidError` (raising one needs CAP_SYS_RESOURCE).
                Fixed at create (``update`` does not change them).
            user: who commands run as when they name no user (a name, uid or
                ``"uid:gid"``); default: the image config's user, else root.
            layers: named layers (see :meth:`build_layer`, :meth:`AsyncSandbox.commit`)
                stacked on the image, later ones higher: a file of a higher
                layer shadows the same path below, and whiteouts hide it.
                A stored layer digest ``"sha256:<hex>"`` works too. The
                image and layers together hold at most 40 layers.
            network: what the sandbox may reach: a :class:`NetworkPolicy` or
                ``"none"`` (loopback only, the default), ``"open"`` (NAT out
                through the node) or ``"allow:CIDR[:PORT][/tcp|/udp],..."``.
                No mode reaches the node's own services, metadata addresses
                or other sandboxes. A bad policy is :class:`InvalidError`
                naming the field.
            harness: make the sandbox a harness: its processes reach the API
                at ``/dev/warren.sock`` (``$WARREN_ADDR``, which this SDK
                reads), where they may create sandboxes (its children) and
                drive those only; everything else is
                :class:`PermissionDeniedError`. Deleting the harness, or its
                death, deletes its children. A harness cannot create one.
            max_children: with ``harness``: how many children it may have at
                once (0 = 32, at most 1024); past it :class:`ExhaustedError`.
            call_timeout: client deadline of this call (default ``create_timeout``).
            qos: the CPU QoS class: ``"be"`` (best-effort, SCHED_IDLE: it
                gets the CPU others leave; the default) or ``"ls"``
                (latency-sensitive: more CPU weight, and a core of its own
                where the node's kernel has core scheduling).
            qos_cpus: with ``qos="ls"``: pin the sandbox to these CPUs.
        """
        net = _network_json(network)
        if resources is not None and (cpu_millis or memory_bytes or pids_max or disk_bytes):
            raise ValueError("give either resources or cpu_millis/memory_bytes/pids_max/disk_bytes, not both")
        res = resources or Resources(
            cpu_millis=cpu_millis, memory_bytes=memory_bytes, pids_max=pids_max, disk_bytes=disk_bytes
        )
        all_labels = dict(self.labels)
        all_labels.update(labels or {})
        layer_names = _layer_list(layers)
        limits = _rlimit_list(rlimits)

        def start() -> Awaitable[AsyncSandbox]:
            return self._create(
                image=image,
                id=id,
                backend=backend,
                resources=res,
                env=env,
                workdir=workdir,
                labels=all_labels,
                timeout_seconds=timeout_seconds,
                hostname=hostname,
                layers=layer_names,
                user=user,
                keep_etc=keep_etc,
                allow_setuid=allow_setuid,
                user_namespace=user_namespace,
                rlimits=limits,
                network=net,
                harness={"maxChildren": max_children} if max_children else {} if harness else None,
                call_timeout=call_timeout if call_timeout is not None else self.create_timeout,
                qos=qos,
                qos_cpus=qos_cpus,
            )

        return _StartContext(start)

    async def _create(
        self,
        *,
        image: str,
        id: Optional[str],
        backend: Optional[str],
        resources: Resources,
        env: Optional[Mapping[str, str]],
        workdir: Optional[str],
        labels: Dict[str, str],
        timeout_seconds: Optional[float],
        hostname: Optional[str],
        layers: Sequence[str],
        user: Optional[str],
        keep_etc: bool,
        allow_setuid: bool,
        user_namespace: Optional[bool],
        rlimits: Sequence[Rlimit],
        network: Optional[Dict[str, Any]],
        call_timeout: float,
        harness: Optional[Dict[str, Any]] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> "AsyncSandbox":
        if not image:
            raise ValueError("image is required")
        explicit = id is not None
        sid = id if id is not None else _new_id()
        nonce: Optional[str] = None
        if explicit:
            nonce = uuid.uuid4().hex
            labels = dict(labels)
            labels[CREATE_NONCE_LABEL] = nonce
        body = _template_json(
            image=image,
            backend=backend,
            resources=resources,
            env=env,
            workdir=workdir,
            labels=labels,
            timeout_seconds=timeout_seconds,
            hostname=hostname,
            layers=layers,
            user=user,
            keep_etc=keep_etc,
            allow_setuid=allow_setuid,
            user_namespace=user_namespace,
            rlimits=rlimits,
            network=network,
            harness=harness,
            qos=qos,
            qos_cpus=qos_cpus,
        )
        body["id"] = sid

        loop = asyncio.get_running_loop()
        deadline = loop.time() + call_timeout
        sent = SimpleNamespace(sent=False)
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"create: client deadline of {call_timeout:g}s passed", timeout=call_timeout)
                try:
                    # A create sent again is marked a retry: a gateway then
                    # looks for the id on every node before placing it, so
                    # the retry meets the sandbox an earlier attempt made
                    # (AlreadyExists, adopted below) instead of making a
                    # second one with the same id on another node.
                    d = await self._t.unary(
                        _SBX + "Create", body, timeout=left, idempotent=True, sent=sent, again=dict(body, retry=True)
                    )
                    return AsyncSandbox(self, SandboxInfo._from_json(d))
                except AlreadyExistsError as e:
                    if not e.after_ambiguous_failure:
                        raise
                    # An earlier attempt may have created it and lost the
                    # answer: adopt the sandbox if it is ours.
                    info = await self._await_own_sandbox(sid, nonce, deadline, e)
                    if info is not None:
                        return AsyncSandbox(self, info)
                    # It vanished (rolled back): create again.
                    body["retry"] = True
        except BaseException as e:
            # The create may have happened with its answer lost (cancelled,
            # timed out, connection broken): delete it so it cannot leak.
            # API errors mean the daemon refused it: nothing to clean up.
            maybe_made = not isinstance(e, WarrenError) or isinstance(e, (UnavailableError, TimeoutError))
            if maybe_made and sent.sent:
                try:
                    await _finish_despite_cancel(self._reap(sid, nonce), 90.0)
                except asyncio.CancelledError:
                    raise e from None
                except Exception as ce:  # noqa: BLE001
                    log.warning("could not delete sandbox %s after a failed create: %s", sid, ce)
            raise

    async def _await_own_sandbox(
        self, sid: str, nonce: Optional[str], deadline: float, original: AlreadyExistsError
    ) -> Optional[SandboxInfo]:
        """Wait until the sandbox ``sid`` made by one of our attempts runs.
        Returns None if it is gone, raises ``original`` if it is not ours."""
        loop = asyncio.get_running_loop()
        delay = 0.05
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"create: sandbox {sid} still being created at the deadline")
            try:
                d = await self._rpc(_SBX + "Get", {"id": sid}, timeout=min(left, self.timeout))
            except NotFoundError:
                return None
            info = SandboxInfo._from_json(d)
            if nonce is not None and info.labels.get(CREATE_NONCE_LABEL) != nonce:
                raise original
            if info.state == SandboxState.RUNNING:
                return info
            if info.state != SandboxState.CREATING:
                raise ConflictError(f"sandbox {sid} is {info.state.name.lower()} right after its creation: {info.dead_reason}")
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, 0.5)

    #: After a create whose request was sent fails without an answer
    #: (cancelled, timed out, connection lost), the client deletes the
    #: sandbox it may have made, and keeps looking for this long in case the
    #: request reaches the daemon only after the first look.
    create_reap_grace = 3.0

    async def _reap(self, sid: str, nonce: Optional[str]) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + self.create_reap_grace
        delay = 0.05
        while True:
            if await self._delete_if_ours(sid, nonce) or loop.time() >= end:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _delete_if_ours(self, sid: str, nonce: Optional[str]) -> bool:
        """Delete ``sid`` if it exists and is ours; True if it existed."""
        try:
            d = await self._rpc(_SBX + "Get", {"id": sid})
        except NotFoundError:
            return False
        if nonce is not None and SandboxInfo._from_json(d).labels.get(CREATE_NONCE_LABEL) != nonce:
            return True  # somebody else's: leave it alone
        await self.delete(sid, missing_ok=True)
        return True

    async def get(self, id: str, *, timeout: Optional[float] = None) -> "AsyncSandbox":
        """Return the sandbox ``id`` (NotFoundError if there is none)."""
        d = await self._rpc(_SBX + "Get", {"id": id}, timeout=timeout)
        return AsyncSandbox(self, SandboxInfo._from_json(d))

    def sandbox(self, id: str) -> "AsyncSandbox":
        """A handle on sandbox ``id`` without asking the daemon."""
        return AsyncSandbox(self, SandboxInfo(id=id))

    async def list(
        self,
        labels: Optional[Mapping[str, str]] = None,
        *,
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> List["AsyncSandbox"]:
        """The sandboxes carrying all of ``labels`` (all sandboxes when None),
        oldest first (by creation time, then id; through a gateway too).

        With ``page_size`` the daemon answers at most that many per call and
        this method follows ``next_page_token`` until the last page, so the
        result is the same whole list; each page is one call with its own
        ``timeout``. A page starts after the last sandbox of the previous
        one, so a sandbox created while paging may be listed (if it sorts
        later) and one deleted may be missing. None or 0: one call for all."""
        if page_size is not None and page_size < 0:
            raise ValueError("page_size must not be negative")
        body: Dict[str, Any] = {}
        if labels:
            body["labels"] = dict(labels)
        if page_size:
            body["pageSize"] = int(page_size)
        out: List[AsyncSandbox] = []
        while True:
            d = await self._rpc(_SBX + "List", body, timeout=timeout)
            out.extend(AsyncSandbox(self, SandboxInfo._from_json(s)) for s in d.get("sandboxes") or [])
            token = d.get("nextPageToken") or ""
            if not token:
                return out
            if token == body.get("pageToken"):
                raise InternalError(f"list: the daemon answered the same page token {token!r} twice")
            body["pageToken"] = token

    async def delete(self, id: str, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        """Delete sandbox ``id``: its processes are killed and its files are
        gone. With ``missing_ok`` a sandbox that does not exist is fine."""
        try:
            await self._rpc(_SBX + "Delete", {"id": id}, timeout=timeout, idempotent=True)
        except NotFoundError as e:
            if missing_ok or e.after_ambiguous_failure:
                return
            raise

    async def delete_all(
        self,
        labels: Mapping[str, str],
        *,
        concurrency: int = 32,
        allow_all: bool = False,
        timeout: Optional[float] = None,
    ) -> List[str]:
        """Delete every sandbox carrying all of ``labels`` and return their ids.

        Meant for orphan clean-up: give every run's sandboxes a label (the
        client's ``labels``) and reap them with this. An empty ``labels``
        would delete every sandbox of the daemon and is refused unless
        ``allow_all``. Raises :class:`BatchError` if some deletions failed
        (after trying them all)."""
        if not labels and not allow_all:
            raise ValueError("refusing to delete every sandbox: give labels, or allow_all=True")
        victims = await self.list(labels, timeout=timeout)
        res = await map_bounded(lambda sb: self.delete(sb.id, missing_ok=True, timeout=timeout), victims, concurrency)
        res.raise_for_errors()
        return [sb.id for sb in victims]

    async def extend_timeout(self, id: str, seconds: float, *, timeout: Optional[float] = None) -> SandboxInfo:
        """Set sandbox ``id``'s deadline to now + ``seconds``."""
        body = {"id": id, "timeoutSeconds": str(int(math.ceil(seconds)))}
        d = await self._rpc(_SBX + "ExtendTimeout", body, timeout=timeout, idempotent=True)
        return SandboxInfo._from_json(d)

    async def update_sandbox(
        self,
        id: str,
        *,
        cpu_millis: Optional[int] = None,
        memory_bytes: Optional[int] = None,
        pids_max: Optional[int] = None,
        timeout_seconds: Optional[float] = None,
        set_labels: Optional[Mapping[str, str]] = None,
        remove_labels: Optional[Sequence[str]] = None,
        network: Optional[NetworkArg] = None,
        timeout: Optional[float] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> SandboxInfo:
        """Change running sandbox ``id``, all or nothing, and return it as it
        is afterwards. Arguments left None stay as they are. Limits mean
        what they mean in :meth:`create` (``cpu_millis`` 0 = no quota,
        ``memory_bytes``/``pids_max`` 0 = node default); ``timeout_seconds``
        sets the lifetime to end that long from now (0 = node default);
        ``set_labels`` adds or overwrites labels, ``remove_labels`` deletes
        them (absent ones are ignored; a key in both is invalid);
        ``network`` replaces the network policy (as in :meth:`create`): new
        connections follow it at once and established TCP connections it
        forbids are aborted. ``qos`` changes the CPU QoS class (``"ls"`` or
        ``"be"``, as in :meth:`create`) of the running processes at once,
        and ``qos_cpus`` the pinning with it (None or empty: unpinned).

        Raises :class:`ConflictError` naming the state when the sandbox is
        not RUNNING, and :class:`InvalidError` when the node cannot honour
        the update (e.g. a memory limit below what the sandbox holds), in
        which case nothing changed."""
        body: Dict[str, Any] = {"id": id}
        for key, v in (("cpuMillis", cpu_millis), ("memoryBytes", memory_bytes), ("pidsMax", pids_max)):
            if v is not None:
                body[key] = str(int(v))
        if timeout_seconds is not None:
            body["timeoutSeconds"] = str(int(math.ceil(timeout_seconds)))
        if set_labels:
            body["setLabels"] = dict(set_labels)
        if remove_labels:
            body["removeLabels"] = list(remove_labels)
        net = _network_json(network)
        if net is not None:
            body["network"] = net
        if qos is not None:
            body["qos"] = qos
            if qos_cpus:
                body["qosCpus"] = [int(c) for c in qos_cpus]
        elif qos_cpus:
            raise ValueError("qos_cpus changes with qos")
        d = await self._rpc(_SBX + "UpdateSandbox", body, timeout=timeout, idempotent=True)
        return SandboxInfo._from_json(d)

    async def commit_sandbox(
        self, id: str, name: str, *, keep_setuid: bool = False, timeout: Optional[float] = None
    ) -> Layer:
        """Make the writable layer of sandbox ``id`` the named layer ``name``
        (see :meth:`AsyncSandbox.commit`)."""
        if not name:
            raise ValueError("name is required")
        body: Dict[str, Any] = {"sandboxId": id, "name": name}
        if keep_setuid:
            body["keepSetuid"] = True
        d = await self._rpc(
            _SBX + "CommitSandbox",
            body,
            timeout=timeout if timeout is not None else self.transfer_timeout,
            idempotent=False,
        )
        return Layer._from_json(d)

    # -- pause and resume ------------------------------------------------

    async def pause(self, id: str, *, reclaim: bool = False, timeout: Optional[float] = None) -> PauseResult:
        """Freeze every process of running sandbox ``id`` where it is and,
        with ``reclaim``, give back its page cache (and its anonymous memory
        where the node has swap). The sandbox is PAUSED until :meth:`resume`:
        exec and file calls raise :class:`ConflictError` meanwhile, its
        lifetime keeps counting, and it stays paused across a daemon
        restart. :class:`ConflictError` unless RUNNING. Not retried once
        sent (a retry of a pause that happened is a conflict)."""
        body: Dict[str, Any] = {"id": id}
        if reclaim:
            body["reclaim"] = True
        d = await self._rpc(_SBX + "Pause", body, timeout=timeout, idempotent=False)
        return PauseResult._from_json(d)

    async def screenshot(self, id: str, *, timeout: Optional[float] = None) -> Screenshot:
        """Running sandbox ``id``'s screen now, as a PNG (backend
        ``"fullvm"``; :class:`UnsupportedError` for one without a
        display)."""
        d = await self._rpc(_SBX + "Screenshot", {"id": id}, timeout=timeout)
        return Screenshot._from_json(d)

    async def send_input(
        self, id: str, events: Sequence[InputEvent] = (), *, text: str = "", timeout: Optional[float] = None
    ) -> None:
        """Send keyboard and pointer ``events`` to running sandbox ``id``'s
        screen, in order, then type ``text`` key by key (US layout, "\\n"
        is Enter) (backend ``"fullvm"``). :class:`InvalidError` for an
        unknown key or button, a position off the screen or a character
        with no key. Not retried once sent (keys would be typed twice)."""
        body: Dict[str, Any] = {"id": id, "events": [e._to_json() for e in events]}
        if text:
            body["text"] = text
        await self._rpc(_SBX + "SendInput", body, timeout=timeout, idempotent=False)

    async def resume(self, id: str, *, lazy_pages: Optional[bool] = None, timeout: Optional[float] = None) -> ResumeResult:
        """Thaw paused sandbox ``id``, or restore hibernated sandbox ``id``
        from its checkpoint (``result.restored``): its processes continue
        where they stopped. :class:`ConflictError` unless PAUSED or
        HIBERNATED. ``timeout`` defaults to ``transfer_timeout`` (a restore
        reads the checkpoint back)."""
        t = timeout if timeout is not None else self.transfer_timeout
        body: Dict[str, Any] = {"id": id}
        if lazy_pages is not None:
            # True: a hibernated sandbox's memory comes back as it is
            # touched (the rest in the background); None: the node's
            # default (warren serve --lazy-pages).
            body["lazyPages"] = bool(lazy_pages)
        d = await self._rpc(_SBX + "Resume", body, timeout=t, idempotent=False)
        return ResumeResult._from_json(d)

    async def restore(self, id: str, *, timeout: Optional[float] = None) -> ResumeResult:
        """Restore hibernated sandbox ``id`` on the node this client talks
        to. Where nodes share a checkpoint directory (``warren serve
        --checkpoint-dir``), it may have been hibernated on another node:
        it moves here with its id, files, processes and trajectory log, and
        that node forgets it. On its own node this is :meth:`resume`.
        :class:`NotFoundError` when no checkpoint of ``id`` is there;
        :class:`ConflictError` while another node restores it."""
        t = timeout if timeout is not None else self.transfer_timeout
        d = await self._rpc(_SBX + "Restore", {"id": id}, timeout=t, idempotent=False)
        return ResumeResult._from_json(d)

    async def hibernate(self, id: str, *, timeout: Optional[float] = None) -> HibernateResult:
        """Checkpoint running or paused sandbox ``id`` to disk with CRIU and
        release everything it holds on the node: memory, processes,
        mounts. It is HIBERNATED, across daemon restarts and reboots, until
        :meth:`resume` restores it; its lifetime keeps counting.
        :class:`UnsupportedError` (the sandbox keeps running) where CRIU
        cannot checkpoint it; :class:`ConflictError` while calls to it are
        in flight. ``timeout`` defaults to ``transfer_timeout``."""
        t = timeout if timeout is not None else self.transfer_timeout
        d = await self._rpc(_SBX + "Hibernate", {"id": id}, timeout=t, idempotent=False)
        return HibernateResult._from_json(d)

    async def fork(
        self,
        id: str,
        n: int = 1,
        *,
        labels: Optional[Mapping[str, str]] = None,
        lifetime: Optional[float] = None,
        lazy_pages: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> List["AsyncSandbox"]:
        """Make ``n`` copies (at most 64) of sandbox ``id`` from a checkpoint
        of it: each runs its processes from where they were and sees its
        files, on a copy-on-write layer of its own, and then diverges (the
        N rollouts of GRPO from one prepared state). A RUNNING or PAUSED
        sandbox is hibernated for the fork and put back as it was; a
        HIBERNATED one stays hibernated. Forks carry its labels plus
        ``labels``, ``lifetime`` seconds (default: the node's), and a copy
        of its trajectory log. All or nothing. ``timeout`` defaults to
        ``transfer_timeout``."""
        body: Dict[str, Any] = {"id": id, "count": int(n)}
        if labels:
            body["labels"] = dict(labels)
        if lifetime is not None:
            body["timeoutSeconds"] = int(lifetime)
        if lazy_pages is not None:
            body["lazyPages"] = bool(lazy_pages)
        t = timeout if timeout is not None else self.transfer_timeout
        d = await self._rpc(_SBX + "Fork", body, timeout=t, idempotent=False)
        return [AsyncSandbox(self, SandboxInfo._from_json(x)) for x in d.get("sandboxes") or []]

    async def hibernate_by_label(
        self,
        labels: Mapping[str, str],
        *,
        parallelism: int = 0,
        progress: Optional[Callable[[ByLabelEvent], Any]] = None,
        timeout: Optional[float] = None,
    ) -> ByLabelResult:
        """Hibernate every RUNNING or PAUSED sandbox whose labels include all
        of ``labels`` (a trainer's whole rollout batch before it is
        preempted), as :meth:`pause_by_label` pauses them;
        :meth:`resume_by_label` restores them."""
        body: Dict[str, Any] = {"labels": dict(labels), "parallelism": int(parallelism)}
        return await self._by_label("HibernateByLabel", body, progress, timeout)

    async def pause_by_label(
        self,
        labels: Mapping[str, str],
        *,
        reclaim: bool = False,
        parallelism: int = 0,
        progress: Optional[Callable[[ByLabelEvent], Any]] = None,
        timeout: Optional[float] = None,
    ) -> ByLabelResult:
        """Pause every RUNNING sandbox whose labels include all of
        ``labels`` (the rollout batch of a trainer), ``parallelism`` at a
        time (0 = the daemon's 8), calling ``progress`` (a function or
        coroutine function) with each sandbox's :class:`ByLabelEvent` as it
        finishes. A sandbox that fails is an event with ``error``, not an
        exception: check ``result.ok``. Sandboxes in other states are left
        out, so calling it again finishes a batch paused in part.
        ``timeout`` (default ``transfer_timeout``) bounds the whole call."""
        body: Dict[str, Any] = {"labels": dict(labels), "parallelism": int(parallelism)}
        if reclaim:
            body["reclaim"] = True
        return await self._by_label("PauseByLabel", body, progress, timeout)

    async def resume_by_label(
        self,
        labels: Mapping[str, str],
        *,
        parallelism: int = 0,
        progress: Optional[Callable[[ByLabelEvent], Any]] = None,
        timeout: Optional[float] = None,
    ) -> ByLabelResult:
        """Resume every PAUSED or HIBERNATED sandbox whose labels include
        all of ``labels``, as :meth:`pause_by_label` pauses them."""
        body: Dict[str, Any] = {"labels": dict(labels), "parallelism": int(parallelism)}
        return await self._by_label("ResumeByLabel", body, progress, timeout)

    async def _by_label(
        self, method: str, body: Dict[str, Any], progress: Optional[Callable[[ByLabelEvent], Any]], timeout: Optional[float]
    ) -> ByLabelResult:
        if not body["labels"]:
            raise ValueError("labels are required: a call without would match every sandbox of the node")
        t = _positive("timeout", timeout) if timeout is not None else self.transfer_timeout
        events: List[ByLabelEvent] = []
        gen = self._t.server_stream(_SBX + method, body, timeout=t, idempotent=False)
        try:
            async for msg in gen:
                if msg.get("done"):
                    return ByLabelResult(events=tuple(events), total=_int(msg.get("total")), failed=_int(msg.get("failed")))
                ev = ByLabelEvent._from_json(msg)
                events.append(ev)
                if progress is not None:
                    r = progress(ev)
                    if inspect.isawaitable(r):
                        await r
        finally:
            await gen.aclose()
        raise UnavailableError(f"{method}: stream ended without its totals", code="unavailable")

    # -- images ----------------------------------------------------------

    async def list_images(self, *, timeout: Optional[float] = None) -> List[Image]:
        d = await self._rpc(_IMG + "ListImages", {}, timeout=timeout)
        return [Image._from_json(i) for i in d.get("images") or []]

    async def get_image(self, name: str, *, timeout: Optional[float] = None) -> Image:
        d = await self._rpc(_IMG + "GetImage", {"name": name}, timeout=timeout)
        return Image._from_json(d)

    async def import_image(self, name: str, path: str, *, timeout: Optional[float] = None) -> Image:
        """Import a root filesystem directory or tarball (optionally gzipped)
        that the *daemon* can read at ``path`` as image ``name`` (replacing
        an image of that name)."""
        d = await self._rpc(
            _IMG + "ImportImage",
            {"name": name, "path": path},
            timeout=timeout if timeout is not None else self.transfer_timeout,
            idempotent=True,
        )
        return Image._from_json(d)

    async def upload_image(
        self,
        name: str,
        source: TarSource,
        *,
        timeout: Optional[float] = None,
    ) -> Image:
        """Upload a root filesystem as image ``name``: a local directory, a
        local tarball (plain or gzipped), tar bytes, or a binary file object
        (read from its current position)."""
        d = await self._put_tar("/v1/images/" + _quote_name(name), source, timeout)
        return Image._from_json(d)

    async def _put_tar(self, path: str, source: TarSource, timeout: Optional[float]) -> Dict[str, Any]:
        """PUT a tarball (see :data:`TarSource`) to ``path`` and return the
        JSON answer. Retried like an idempotent call, except for a file
        object that cannot seek (its bytes cannot be sent again)."""
        body: Callable[[], Any]
        spool: Optional[IO[bytes]] = None
        idempotent = True
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            body = lambda: data  # noqa: E731
        elif isinstance(source, (str, os.PathLike)):
            local = os.fspath(source)
            if os.path.isdir(local):
                spool = await asyncio.get_running_loop().run_in_executor(None, _archive.build_tar, local)
            else:
                spool = open(local, "rb")
            f = spool
            body = lambda: _archive.iter_file(f)  # noqa: E731
        else:
            fobj = source
            if fobj.seekable():
                start = fobj.tell()

                async def again() -> AsyncIterator[bytes]:
                    fobj.seek(start)
                    while True:
                        chunk = fobj.read(_archive.CHUNK)
                        if not chunk:
                            return
                        yield chunk

                body = again
            else:
                idempotent = False
                body = lambda: _archive.iter_file(fobj)  # noqa: E731
        try:
            raw = await self._t.http(
                "PUT",
                path,
                body=body,
                content_type="application/x-tar",
                timeout=timeout if timeout is not None else self.transfer_timeout,
                idempotent=idempotent,
            )
        finally:
            if spool is not None:
                spool.close()
        assert isinstance(raw, bytes)
        out = json.loads(raw) if raw else {}
        return out if isinstance(out, dict) else {}

    async def remove_image(self, name: str, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        """Remove image ``name`` (ConflictError while a sandbox uses it)."""
        try:
            await self._rpc(_IMG + "RemoveImage", {"name": name}, timeout=timeout, idempotent=True)
        except NotFoundError as e:
            if missing_ok or e.after_ambiguous_failure:
                return
            raise

    def pull_image(
        self,
        ref: str,
        name: Optional[str] = None,
        *,
        platform: Optional[str] = None,
        progress: Optional[PullProgress] = None,
        timeout: Optional[float] = None,
    ) -> "ImagePull":
        """Import an OCI or Docker image into the daemon's store, with progress.

        ``ref`` is a registry reference (``registry/repo:tag``,
        ``registry/repo@sha256:...``, ``docker://...``), an OCI image layout
        ``oci:DIR[:TAG]`` or a ``docker save`` tarball
        ``docker-archive:FILE[:REPO:TAG]``; paths are read by the *daemon*,
        on its host, and registry credentials come from the daemon's Docker
        config. ``name`` defaults to one derived from the reference
        (``"python:3.12"``); an image of that name is replaced. ``platform``
        (``os/arch[/variant]``) picks from a multi-platform image (default:
        linux on the daemon's architecture).

        Await the result for the :class:`Image`, with ``progress`` (a
        function or coroutine function) called with every
        :class:`PullEvent`; or iterate over the events (the last one carries
        the image, also in ``.image`` afterwards)::

            img = await w.pull_image("python:3.12", progress=print)

            async with w.pull_image("oci:/srv/layouts/app:v1", "app") as pull:
                async for ev in pull:
                    print(ev.phase, ev.layer, ev.status, ev.current, ev.total)
            print(pull.image)

        Layers already stored (same diffID) are not downloaded again, and a
        failed pull leaves no image. Leaving the iteration early or
        cancelling closes the request and the daemon stops the import.

        Retries: a pull is idempotent (it makes image ``name`` from ``ref``,
        replacing an image of that name, and stored layers are reused), so
        transient failures are retried, also after the daemon got the
        request; a stream broken after some events is started over (its
        events begin again with ``"resolve"``) within the retry policy's
        attempts and the deadline. ``timeout`` (default ``transfer_timeout``)
        bounds the whole pull.
        """
        if not ref:
            raise ValueError("ref is required")
        body: Dict[str, Any] = {"ref": ref}
        if name:
            body["name"] = name
        if platform:
            body["platform"] = platform
        t = _positive("timeout", timeout) if timeout is not None else self.transfer_timeout
        return ImagePull(self, body, t, progress)

    def pull_image_stream(
        self,
        ref: str,
        name: Optional[str] = None,
        *,
        platform: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "ImagePull":
        """The same as :meth:`pull_image` without a callback (the name the
        synchronous twin uses for iterating over the events)."""
        return self.pull_image(ref, name, platform=platform, timeout=timeout)

    # -- named layers ----------------------------------------------------

    async def build_layer(
        self,
        name: str,
        source: Optional[TarSource] = None,
        *,
        path: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Layer:
        """Make a directory tree or tarball the named layer ``name``,
        replacing a layer of that name. Give exactly one of:

        - ``source``: uploaded by the client: a local directory (tarred), a
          local tarball (plain or gzipped), tar bytes, or a binary file
          object (read from its current position);
        - ``path``: an absolute path *on the daemon's host* of a directory
          or tarball, read by the daemon itself (nothing is uploaded).

        A file ``.wh.X`` in the tree hides ``X`` of the layers below, and
        ``.wh..wh..opq`` in a directory hides the whole directory below
        (OCI whiteouts). Stack layers on an image with
        ``create(image, layers=[...])``.

        Retries: a build is idempotent (the same input makes the same layer
        under the same name), so transient failures are retried, except for
        an upload from a file object that cannot seek. ``timeout`` defaults
        to ``transfer_timeout``."""
        if not name:
            raise ValueError("name is required")
        if (source is None) == (path is None):
            raise ValueError("give exactly one of source (uploaded) or path (read by the daemon)")
        if path is not None:
            d = await self._rpc(
                _IMG + "BuildLayer",
                {"name": name, "path": path},
                timeout=timeout if timeout is not None else self.transfer_timeout,
                idempotent=True,
            )
        else:
            assert source is not None
            d = await self._put_tar("/v1/layers/" + _quote_name(name), source, timeout)
        return Layer._from_json(d)

    async def list_layers(self, *, timeout: Optional[float] = None) -> List[Layer]:
        """The named layers, by name."""
        d = await self._rpc(_IMG + "ListLayers", {}, timeout=timeout)
        return [Layer._from_json(x) for x in d.get("layers") or []]

    async def remove_layer(self, name: str, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        """Remove the named layer ``name``. :class:`ConflictError` while a
        sandbox (that is not dead) uses it; :class:`NotFoundError` when there
        is none, unless ``missing_ok``. Its blob is collected once no image,
        layer or sandbox uses it."""
        try:
            await self._rpc(_IMG + "RemoveLayer", {"name": name}, timeout=timeout, idempotent=True)
        except NotFoundError as e:
            if missing_ok or e.after_ambiguous_failure:
                return
            raise

    # -- image store -----------------------------------------------------

    async def image_stats(self, names: Names = None, *, timeout: Optional[float] = None) -> List[LayerStat]:
        """How much of each layer is loaded on the daemon's node: for every
        layer of the images ``names`` (one name or several; a named layer as
        ``"layer:NAME"``; every image and named layer when None), its blob
        size, the bytes of it in the page cache (with on-demand loading,
        what sandboxes have read), its file count, and whether it is mounted
        and by how many sandboxes. :class:`NotFoundError` for an unknown
        name."""
        d = await self._rpc(_IMG + "ImageStats", {"names": _names(names)}, timeout=timeout)
        return [LayerStat._from_json(x) for x in d.get("layers") or []]

    async def verify_image(self, names: Names = None, *, timeout: Optional[float] = None) -> List[LayerVerification]:
        """Hash the stored blobs of the images ``names`` (one name or
        several; a named layer as ``"layer:NAME"``; every stored blob when
        None) and return each one's result. A corrupt blob is reported
        (``ok=False`` with the ``error``), not raised; an unknown name is
        :class:`NotFoundError`. ``timeout`` defaults to ``transfer_timeout``
        (every blob is read in full)."""
        d = await self._rpc(
            _IMG + "VerifyImage",
            {"names": _names(names)},
            timeout=timeout if timeout is not None else self.transfer_timeout,
        )
        return [LayerVerification._from_json(x) for x in d.get("layers") or []]

    # -- system ----------------------------------------------------------

    # -- fncall: jobs in pooled environments -----------------------------

    async def run(
        self,
        image: str,
        command: Any = None,
        *,
        steps: Optional[Sequence[Step]] = None,
        backend: str = "fncall",
        gpus: int = 0,
        shared_gpu: bool = False,
        timeout: Optional[float] = None,
        **step_options: Any,
    ) -> RunResult:
        """Run one job in a fresh, isolated environment of ``image`` (the
        ``fncall`` backend: a pooled environment, reset between jobs) and
        return every step's :class:`JobStepResult`. Give ``command`` (an argv
        list, or a string for ``sh -c``) with :class:`Step` options as
        keywords, or ``steps``. A program's failure is a step's status;
        exceptions mean the request was invalid or Warren failed.

        ``gpus`` of the node's GPUs (``version().gpus``) are the job's:
        their ``/dev/nvidia<N>``, the driver's libraries and tools under
        ``/usr/local/nvidia``. The job waits until they are free; with
        ``shared_gpu`` it runs beside other shared jobs on them."""
        body: Dict[str, Any] = {"image": image, "backend": backend, "steps": [s._to_json() for s in _job_steps(command, steps, step_options)]}
        if gpus or shared_gpu:
            body["gpus"] = {"count": gpus, "shared": shared_gpu}
        d = await self._rpc(_SBX + "Run", body, timeout=timeout, idempotent=False)
        return RunResult._from_json(d)

    async def run_batch(
        self,
        image: str,
        jobs: Sequence[Any],
        *,
        parallelism: int = 0,
        backend: str = "fncall",
        gpus: int = 0,
        shared_gpu: bool = False,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[Tuple[int, Union[RunResult, WarrenError]]]:
        """Run many jobs of ``image`` at once (``parallelism`` at a time;
        0: the node's choice) and yield ``(index, result)`` as each job
        finishes; ``result`` is a :class:`WarrenError` for a job Warren
        failed to run. A job is a :class:`Step`, a list of them, or a
        command. ``gpus`` and ``shared_gpu`` are every job's (see
        :meth:`run`)."""
        job_gpus = {"gpus": {"count": gpus, "shared": shared_gpu}} if gpus or shared_gpu else {}
        body = {
            "image": image,
            "backend": backend,
            "parallelism": parallelism,
            "jobs": [{"steps": [s._to_json() for s in _job_steps(j, None, {})], **job_gpus} for j in jobs],
        }
        gen = self._t.server_stream(_SBX + "RunBatch", body, timeout=timeout or self.timeout, idempotent=False)
        try:
            async for item in gen:
                idx = _int(item.get("index"))
                if item.get("error"):
                    yield idx, error_from_status(None, item["error"], category=item.get("errorCategory") or "internal")
                else:
                    yield idx, RunResult._from_json(item.get("result") or {})
        finally:
            await gen.aclose()

    async def version(self, *, timeout: Optional[float] = None) -> VersionInfo:
        d = await self._rpc(_SYS + "Version", {}, timeout=timeout)
        return VersionInfo._from_json(d)

    async def nodes(self, *, timeout: Optional[float] = None) -> List[NodeStatus]:
        """The cluster's nodes as the gateway at ``addr`` sees them (``warren
        gateway``; a node that is down is listed with ``up=False`` and what
        the gateway last heard from it), or, from a node, the node itself:
        its capacity, what its live sandboxes take, its load, its mounted
        layers and its sandboxes' labels and QoS classes. Like ``warren
        nodes``. Read-only, so retried like any idempotent call."""
        d = await self._rpc(_SYS + "NodeStatus", {}, timeout=timeout)
        return [NodeStatus._from_json(n) for n in d.get("nodes") or []]

    async def health(self, *, timeout: Optional[float] = None) -> bool:
        """True when the daemon answers its health check (raises otherwise)."""
        raw = await self._t.http("GET", "/healthz", timeout=timeout or self.timeout, idempotent=True)
        return isinstance(raw, bytes) and raw.strip() == b"ok"

    async def metrics(self, *, timeout: Optional[float] = None) -> str:
        """The daemon's Prometheus metrics (text format)."""
        raw = await self._t.http("GET", "/metrics", timeout=timeout or self.timeout, idempotent=True)
        assert isinstance(raw, bytes)
        return raw.decode("utf-8", "replace")

    # -- batches ---------------------------------------------------------

    def create_many(
        self,
        n: int,
        image: str,
        *,
        concurrency: int = 16,
        strict: bool = False,
        ids: Optional[Sequence[str]] = None,
        **create_kwargs: Any,
    ) -> "_StartContext[AsyncSandboxGroup]":
        """Create ``n`` sandboxes, at most ``concurrency`` at a time. Await it
        for an :class:`AsyncSandboxGroup` or use it as an async context
        manager (which deletes them all on exit).

        Failed creations are in ``group.errors``; with ``strict`` any failure
        deletes the sandboxes made so far and raises :class:`BatchError`.
        A cancelled ``create_many`` deletes what it created."""
        if n < 0:
            raise ValueError("n must not be negative")
        if ids is not None and len(ids) != n:
            raise ValueError("ids must have n entries")

        async def run() -> AsyncSandboxGroup:
            made: List[AsyncSandbox] = []

            def one(i: int) -> Callable[[], Awaitable[AsyncSandbox]]:
                async def go() -> AsyncSandbox:
                    kw = dict(create_kwargs)
                    if ids is not None:
                        kw["id"] = ids[i]
                    sb = await self.create(image, **kw)
                    made.append(sb)
                    return sb

                return go

            try:
                res = await gather_bounded([one(i) for i in range(n)], concurrency)
            except BaseException:
                await _finish_despite_cancel(_delete_quietly_many(self, made), 120.0)
                raise
            group = AsyncSandboxGroup(self, [o.value for o in res if o.ok], res.errors)  # type: ignore[misc]
            if strict and group.errors:
                await _finish_despite_cancel(group.delete(), 120.0)
                res.raise_for_errors()
            return group

        return _StartContext(run)

    def batch_create(
        self,
        n: int,
        image: str,
        *,
        backend: Optional[str] = None,
        resources: Optional[Resources] = None,
        cpu_millis: int = 0,
        memory_bytes: int = 0,
        pids_max: int = 0,
        disk_bytes: int = 0,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        hostname: Optional[str] = None,
        layers: Optional[Sequence[str]] = None,
        user: Optional[str] = None,
        keep_etc: bool = False,
        allow_setuid: bool = False,
        user_namespace: Optional[bool] = None,
        rlimits: Optional[RlimitsArg] = None,
        network: Optional[NetworkArg] = None,
        harness: bool = False,
        max_children: int = 0,
        strict: bool = False,
        call_timeout: Optional[float] = None,
    ) -> "_StartContext[AsyncSandboxGroup]":
        """Create ``n`` sandboxes (1..1000) from one template in a single
        ``BatchCreate`` call: a gateway places them all at once, spreading
        them over its nodes; a node makes them a few at a time. Await it for
        an :class:`AsyncSandboxGroup` or use it as an async context manager
        (which deletes them all on exit). The options are :meth:`create`'s,
        except ``id``: the daemon names every sandbox.

        Partial failure: the call fails as a whole (raises) only for an
        invalid request or, through a gateway, when it cannot place them
        all (placement is all or nothing: nothing is made); otherwise the
        group holds the sandboxes made, in no particular order, and
        ``group.errors`` one ``(k, WarrenError)`` per sandbox that was not
        made (``k`` counts the failures; the daemon reports them as
        messages only, so they are plain :class:`WarrenError`, category
        ``"unknown"``). With ``strict`` any failure deletes the sandboxes
        made and raises :class:`BatchError`.

        Retries: a batch create is not idempotent (the daemon picks the
        ids), so it is retried only when the request cannot have reached the
        daemon (the connection failed). When it fails after the request was
        sent without an answer (timed out, cancelled, connection lost), the
        client deletes every sandbox the call may have made: they carry a
        label :data:`CREATE_NONCE_LABEL` unique to the call. For creates
        that may be retried safely, use :meth:`create_many` with ``ids``.

        Args:
            call_timeout: client deadline of the call (default ``create_timeout``).
        """
        if not 1 <= n <= 1000:
            raise ValueError("n must be 1..1000")
        if not image:
            raise ValueError("image is required")
        if resources is not None and (cpu_millis or memory_bytes or pids_max or disk_bytes):
            raise ValueError("give either resources or cpu_millis/memory_bytes/pids_max/disk_bytes, not both")
        nonce = uuid.uuid4().hex
        all_labels = dict(self.labels)
        all_labels.update(labels or {})
        all_labels[CREATE_NONCE_LABEL] = nonce
        template = _template_json(
            image=image,
            backend=backend,
            resources=resources
            or Resources(cpu_millis=cpu_millis, memory_bytes=memory_bytes, pids_max=pids_max, disk_bytes=disk_bytes),
            env=env,
            workdir=workdir,
            labels=all_labels,
            timeout_seconds=timeout_seconds,
            hostname=hostname,
            layers=_layer_list(layers),
            user=user,
            keep_etc=keep_etc,
            allow_setuid=allow_setuid,
            user_namespace=user_namespace,
            rlimits=_rlimit_list(rlimits),
            network=_network_json(network),
            harness={"maxChildren": max_children} if max_children else {} if harness else None,
        )
        t = call_timeout if call_timeout is not None else self.create_timeout

        async def run() -> AsyncSandboxGroup:
            sent = SimpleNamespace(sent=False)
            try:
                d = await self._t.unary(
                    _SBX + "BatchCreate", {"template": template, "count": n}, timeout=t, idempotent=False, sent=sent
                )
            except BaseException as e:
                maybe_made = not isinstance(e, WarrenError) or isinstance(e, (UnavailableError, TimeoutError))
                if maybe_made and sent.sent:
                    try:
                        await _finish_despite_cancel(self._reap_labeled({CREATE_NONCE_LABEL: nonce}), 120.0)
                    except asyncio.CancelledError:
                        raise e from None
                    except Exception as ce:  # noqa: BLE001
                        log.warning("could not delete the sandboxes of a failed batch create: %s", ce)
                raise
            made = [AsyncSandbox(self, SandboxInfo._from_json(s)) for s in d.get("sandboxes") or []]
            errors: List[Tuple[int, BaseException]] = [
                (k, WarrenError(msg, procedure=_SBX + "BatchCreate")) for k, msg in enumerate(d.get("errors") or [])
            ]
            group = AsyncSandboxGroup(self, made, errors)
            if strict and errors:
                await _finish_despite_cancel(group.delete(), 120.0)
                err = BatchError(f"batch create: {len(errors)} of {n} sandboxes failed: {errors[0][1]}", errors)
                raise err from errors[0][1]
            return group

        return _StartContext(run)

    async def _reap_labeled(self, labels: Mapping[str, str]) -> None:
        """Delete the sandboxes carrying ``labels``, looking again for
        ``create_reap_grace`` seconds for ones still being made."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.create_reap_grace
        delay = 0.05
        while True:
            left = await self.list(labels)
            for sb in left:
                await self.delete(sb.id, missing_ok=True)
            if not left and loop.time() >= end:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def exec_many(
        self,
        jobs: Iterable[Union["ExecJob", Tuple[Union["AsyncSandbox", "Sandbox", str], Command]]],
        *,
        concurrency: Optional[int] = None,
        **exec_kwargs: Any,
    ) -> BatchResult[ExecResult]:
        """Run many commands across many sandboxes, at most ``concurrency``
        at a time (default: ``max_connections``), and return their outcomes
        in order: a failed item holds its exception, the others their
        :class:`ExecResult`. ``jobs`` holds ``(sandbox_or_id, command)``
        pairs or :class:`ExecJob` objects; ``exec_kwargs`` apply to all."""
        factories: List[Callable[[], Awaitable[ExecResult]]] = []
        for job in jobs:
            if isinstance(job, ExecJob):
                sb, cmd, kw = job.sandbox, job.command, dict(exec_kwargs, **job.options)
            else:
                sb, cmd = job
                kw = exec_kwargs
            if isinstance(sb, AsyncSandbox):
                handle = sb
            elif isinstance(sb, str):
                handle = self.sandbox(sb)
            else:  # the synchronous twin's Sandbox
                handle = sb.aio
            factories.append(_bind_exec(handle, cmd, kw))
        return await gather_bounded(factories, concurrency or self.max_connections)

    async def map(
        self,
        fn: Callable[[Any], Awaitable[T]],
        items: Iterable[Any],
        *,
        concurrency: Optional[int] = None,
    ) -> BatchResult[T]:
        """Await ``fn(item)`` for every item with a concurrency bound; per-item
        outcomes in order."""
        return await map_bounded(fn, items, concurrency or self.max_connections)


def _bind_exec(sb: "AsyncSandbox", cmd: Command, kw: Mapping[str, Any]) -> Callable[[], Awaitable[ExecResult]]:
    return lambda: sb.exec(cmd, **kw)


async def _delete_quietly_many(client: AsyncWarren, sandboxes: Sequence["AsyncSandbox"]) -> None:
    res = await map_bounded(lambda sb: client.delete(sb.id, missing_ok=True), list(sandboxes), 32)
    for i, e in res.errors:
        log.warning("could not delete sandbox %s: %s", sandboxes[i].id, e)


class ExecJob:
    """One item of :meth:`AsyncWarren.exec_many`: a command for a sandbox,
    with optional per-job ``exec`` options."""

    __slots__ = ("sandbox", "command", "options")

    def __init__(self, sandbox: Union["AsyncSandbox", "Sandbox", str], command: Command, **options: Any) -> None:
        self.sandbox = sandbox
        self.command = command
        self.options: Dict[str, Any] = options

    def __repr__(self) -> str:
        sid = self.sandbox if isinstance(self.sandbox, str) else self.sandbox.id
        return f"ExecJob({sid!r}, {self.command!r})"


class _Closing(Protocol):
    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None: ...


C = TypeVar("C", bound=_Closing)


class _StartContext(Generic[C]):
    """What :meth:`AsyncWarren.create` and :meth:`AsyncWarren.create_many`
    return: awaitable for the handle, and an async context manager that
    closes (deletes) what it started on exit."""

    def __init__(self, start: Callable[[], Awaitable[C]]) -> None:
        self._start = start
        self._handle: Optional[C] = None

    def __await__(self) -> Generator[Any, None, C]:
        return self._start().__await__()

    async def __aenter__(self) -> C:
        self._handle = await self._start()
        return self._handle

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        if self._handle is not None:
            await self._handle.__aexit__(et, e, tb)


def _template_json(
    *,
    image: str,
    backend: Optional[str],
    resources: Resources,
    env: Optional[Mapping[str, str]],
    workdir: Optional[str],
    labels: Mapping[str, str],
    timeout_seconds: Optional[float],
    hostname: Optional[str],
    layers: Sequence[str],
    user: Optional[str],
    keep_etc: bool,
    allow_setuid: bool,
    user_namespace: Optional[bool],
    rlimits: Sequence[Rlimit],
    network: Optional[Dict[str, Any]],
    harness: Optional[Dict[str, Any]],
    qos: Optional[str] = None,
    qos_cpus: Optional[Sequence[int]] = None,
) -> Dict[str, Any]:
    """The JSON of a CreateRequest without its id (create's and
    batch_create's template)."""
    body: Dict[str, Any] = {"image": image}
    if backend:
        body["backend"] = backend
    r = resources._to_json()
    if r:
        body["resources"] = r
    if env:
        body["env"] = dict(env)
    if workdir:
        body["workdir"] = workdir
    if labels:
        body["labels"] = dict(labels)
    if timeout_seconds:
        body["timeoutSeconds"] = str(int(math.ceil(timeout_seconds)))
    if hostname:
        body["hostname"] = hostname
    if layers:
        body["layers"] = list(layers)
    if user:
        body["user"] = user
    if keep_etc:
        body["keepEtc"] = True
    if allow_setuid:
        body["allowSetuid"] = True
    if user_namespace is not None:
        body["userNamespace"] = user_namespace
    if rlimits:
        body["rlimits"] = [r._to_json() for r in rlimits]
    if network is not None:
        body["network"] = network
    if harness is not None:
        body["harness"] = harness
    if qos:
        body["qos"] = qos
    if qos_cpus:
        body["qosCpus"] = [int(c) for c in qos_cpus]
    return body


# ---------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------


class AsyncSandbox:
    """A handle on one sandbox. ``info`` is what the daemon last said about
    it (refresh with :meth:`refresh`). As an async context manager it
    deletes the sandbox on exit, also on exceptions and cancellation."""

    def __init__(self, client: AsyncWarren, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        #: the rollout session numbering this handle's calls (warren.rollout)
        self._rollout: Optional[Rollout] = None

    def _step(self, body: Dict[str, Any], method: Optional[str] = None, payload: bytes = b"") -> Optional[Mapping[str, Any]]:
        """Number a mutating call as the next step of the active rollout
        session, if any. Called before the call's first await, so that
        calls started in one order (asyncio.gather too) get the same
        numbers on every run of the same code. Returns the step's recorded
        entry when the rollout read it and the request matches it (the
        call is then answered without a round trip)."""
        if self._rollout is None:
            return None
        seq = self._rollout._next()
        body["sessionId"], body["seq"] = self._rollout.session_id, str(seq)
        if method is None:
            return None
        return self._rollout._match(seq, method, body, payload)

    def _stepped(self, replayed: Any) -> None:
        if self._rollout is not None:
            self._rollout._count(bool(replayed))

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def layers(self) -> Tuple[str, ...]:
        """The named layers on the sandbox's image, bottom first (from ``info``)."""
        return self.info.layers

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.info.state.name.lower()}>"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        try:
            await _finish_despite_cancel(self.client.delete(self.id, missing_ok=True), self.client.timeout + 60.0)
        except asyncio.CancelledError:
            raise
        except Exception as de:  # noqa: BLE001
            if e is None:
                raise
            log.warning("could not delete sandbox %s: %s", self.id, de)

    # -- lifecycle -------------------------------------------------------

    async def refresh(self, *, timeout: Optional[float] = None) -> SandboxInfo:
        """Ask the daemon for the sandbox's current state."""
        d = await self.client._rpc(_SBX + "Get", {"id": self.id}, timeout=timeout)
        self.info = SandboxInfo._from_json(d)
        return self.info

    async def delete(self, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        """Delete the sandbox."""
        await self.client.delete(self.id, missing_ok=missing_ok, timeout=timeout)

    async def extend_timeout(self, seconds: float, *, timeout: Optional[float] = None) -> SandboxInfo:
        """Set the sandbox's deadline to now + ``seconds``."""
        self.info = await self.client.extend_timeout(self.id, seconds, timeout=timeout)
        return self.info

    async def screenshot(self, *, timeout: Optional[float] = None) -> Screenshot:
        """The sandbox's screen now (see :meth:`AsyncWarren.screenshot`)."""
        return await self.client.screenshot(self.id, timeout=timeout)

    async def send_input(
        self, events: Sequence[InputEvent] = (), *, text: str = "", timeout: Optional[float] = None
    ) -> None:
        """Keys and pointer events to the sandbox's screen (see :meth:`AsyncWarren.send_input`)."""
        await self.client.send_input(self.id, events, text=text, timeout=timeout)

    async def pause(self, *, reclaim: bool = False, timeout: Optional[float] = None) -> PauseResult:
        """Freeze the sandbox's processes where they are and, with
        ``reclaim``, give back its memory (see :meth:`AsyncWarren.pause`)."""
        res = await self.client.pause(self.id, reclaim=reclaim, timeout=timeout)
        self.info = res.sandbox
        return res

    async def resume(self, *, lazy_pages: Optional[bool] = None, timeout: Optional[float] = None) -> ResumeResult:
        """Thaw the paused sandbox, or restore the hibernated one: its
        processes continue where they stopped."""
        res = await self.client.resume(self.id, lazy_pages=lazy_pages, timeout=timeout)
        self.info = res.sandbox
        return res

    async def hibernate(self, *, timeout: Optional[float] = None) -> HibernateResult:
        """Checkpoint the sandbox to disk and release what it holds on the
        node (see :meth:`AsyncWarren.hibernate`); :meth:`resume` restores it."""
        res = await self.client.hibernate(self.id, timeout=timeout)
        self.info = res.sandbox
        return res

    async def fork(
        self,
        n: int = 1,
        *,
        labels: Optional[Mapping[str, str]] = None,
        lifetime: Optional[float] = None,
        lazy_pages: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> List["AsyncSandbox"]:
        """``n`` copies of the sandbox from a checkpoint of it (see
        :meth:`AsyncWarren.fork`)."""
        forks = await self.client.fork(self.id, n, labels=labels, lifetime=lifetime, lazy_pages=lazy_pages, timeout=timeout)
        await self.refresh()
        return forks

    async def update(
        self,
        *,
        cpu_millis: Optional[int] = None,
        memory_bytes: Optional[int] = None,
        pids_max: Optional[int] = None,
        timeout_seconds: Optional[float] = None,
        set_labels: Optional[Mapping[str, str]] = None,
        remove_labels: Optional[Sequence[str]] = None,
        network: Optional[NetworkArg] = None,
        timeout: Optional[float] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> SandboxInfo:
        """Change the running sandbox's limits, lifetime, labels, network or
        QoS class, all or nothing (see :meth:`AsyncWarren.update_sandbox`)."""
        self.info = await self.client.update_sandbox(
            self.id,
            cpu_millis=cpu_millis,
            memory_bytes=memory_bytes,
            pids_max=pids_max,
            timeout_seconds=timeout_seconds,
            set_labels=set_labels,
            remove_labels=remove_labels,
            network=network,
            timeout=timeout,
            qos=qos,
            qos_cpus=qos_cpus,
        )
        return self.info

    async def commit(self, name: str, *, keep_setuid: bool = False, timeout: Optional[float] = None) -> Layer:
        """Make the sandbox's writable layer (everything it created, changed
        or deleted on top of its image and layers) the named layer ``name``,
        replacing a layer of that name, and return it.

        What the sandbox wrote is untrusted: setuid/setgid bits and
        ``security.capability`` xattrs are stripped from the layer (else a
        uid-1000 agent could plant a setuid-root binary for every sandbox
        that uses the layer) unless ``keep_setuid``; the layer records
        which (``Layer.setuid_kept``, ``Layer.setuid_stripped``).

        Deletions are kept as whiteouts, so a sandbox created from the same
        image and layers with this one on top sees the same files::

            layer = await sb.commit("ws-step-3")
            sb2 = await w.create(sb.info.image, layers=[*sb.layers, "ws-step-3"])

        The sandbox's processes are frozen while its files are read and
        resume afterwards. :class:`ConflictError` while another commit of
        the sandbox runs; :class:`InvalidError` for files named ``.wh.*``.

        Retries: a commit is *not* idempotent (a second one would snapshot
        the sandbox again, whose files may have changed meanwhile, or meet
        the first one still running), so it is retried only when the
        request certainly did not reach the daemon. ``timeout`` defaults to
        ``transfer_timeout``."""
        return await self.client.commit_sandbox(self.id, name, keep_setuid=keep_setuid, timeout=timeout)

    # -- exec ------------------------------------------------------------

    def _exec_body(
        self,
        command: Command,
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        user: Optional[str],
        stdin: Optional[Data],
        timeout: Optional[float],
        output_limit: Optional[int],
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {"sandboxId": self.id}
        _set_command(body, command)
        if env:
            body["env"] = dict(env)
        if cwd:
            body["cwd"] = cwd
        if user:
            body["user"] = str(user)
        if stdin:
            body["stdin"] = _b64(stdin)
        if timeout is not None:
            body["timeoutMs"] = _ms(timeout)
        if output_limit:
            body["outputLimitBytes"] = str(int(output_limit))
        return body

    async def exec(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[float] = None,
        output_limit: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        check: bool = False,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> ExecResult:
        """Run a command to completion and return its :class:`ExecResult`.

        Args:
            command: a shell string (``/bin/sh -c``) or an argv list.
            env: merged over the sandbox's environment.
            cwd: working directory (default: the sandbox's workdir).
            user: name, uid or ``uid:gid`` (default: the sandbox's user, see
                :meth:`AsyncWarren.create`; else root).
            stdin: bytes (or str, UTF-8) fed to the command's stdin.
            timeout: seconds; the daemon kills the command's process group
                when it passes and returns ``timed_out=True``. Default: the
                client's ``exec_timeout``. The client deadline is this plus
                ``deadline_margin``.
            output_limit: bytes kept per stream (default 1 MiB on the daemon).
            idempotency_key: the daemon runs a command at most once per key
                and sandbox (results are kept 10 minutes); generated per call
                when None, which makes retries of this call safe.
            check: raise :class:`CommandError` unless the command succeeded.
            pty: run on a terminal of ``rows`` x ``cols`` (default 24 x 80):
                raw terminal bytes on stdout, stderr empty, ``stdin`` typed
                into the terminal and ended with ^D.

        Cancelling the awaiting task closes the request, and the daemon kills
        the command."""
        t = _positive("timeout", timeout) if timeout is not None else self.client.exec_timeout
        body = self._exec_body(command, env, cwd, user, stdin, t, output_limit)
        _set_pty(body, pty, rows, cols)
        body["idempotencyKey"] = idempotency_key or uuid.uuid4().hex
        hit = self._step(body, "exec", _raw(stdin))
        if hit is not None:
            assert self._rollout is not None  # a hit comes from it
            r = self._rollout._exec_result(hit)
        else:
            d = await self.client._rpc(_SBX + "Exec", body, timeout=self.client._exec_deadline(t), idempotent=True)
            r = ExecResult._from_json(d)
            self._stepped(r.replayed)
        self.client._check_truncation(r, command)
        if check:
            r.check(allow_truncation=self.client.on_truncation != "raise")
        return r

    def exec_stream(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[float] = None,
        output_limit: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> "ExecStream":
        """Run a command and stream its output: an async iterator of
        :class:`ExecEvent` (stdout and stderr chunks as they come, then the
        result). Use it with ``async with`` so that leaving early stops the
        command::

            async with sb.exec_stream("make test") as st:
                async for ev in st:
                    if ev.stdout: print(ev.stdout.decode(), end="")
            print(st.result.exit_code)
        """
        t = _positive("timeout", timeout) if timeout is not None else self.client.exec_timeout
        body = self._exec_body(command, env, cwd, user, stdin, t, output_limit)
        _set_pty(body, pty, rows, cols)  # as in exec
        body["idempotencyKey"] = idempotency_key or uuid.uuid4().hex
        self._step(body)
        return ExecStream(self, body, self.client._exec_deadline(t), command)

    # -- background processes -------------------------------------------

    async def start(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[float] = None,
        output_limit: Optional[int] = None,
        call_timeout: Optional[float] = None,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> "AsyncProcess":
        """Start a background process and return at once. Its stdin stays
        open for :meth:`AsyncProcess.write_stdin`; the sandbox keeps the
        latest ``output_limit`` bytes of each stream (default 1 MiB) for
        :meth:`AsyncProcess.wait` and :meth:`AsyncProcess.attach`. The
        process survives daemon restarts. ``timeout`` (seconds) kills it
        when it passes; None lets it run until the sandbox goes. ``pty``
        runs it on a terminal of ``rows`` x ``cols`` (default 24 x 80), for
        interactive programs: raw terminal bytes on stdout, stdin to the
        terminal, :meth:`AsyncProcess.resize`. Not retried once sent (it is
        not idempotent)."""
        t = _positive("timeout", timeout) if timeout is not None else None
        body = self._exec_body(command, env, cwd, user, stdin, t, output_limit)
        _set_pty(body, pty, rows, cols)
        d = await self.client._rpc(_SBX + "StartProcess", body, timeout=call_timeout, idempotent=False)
        return AsyncProcess(self, ProcessInfo._from_json(d))

    async def processes(self, *, timeout: Optional[float] = None) -> List["AsyncProcess"]:
        """The sandbox's background processes (running or exited), in start order."""
        d = await self.client._rpc(_SBX + "ListProcesses", {"sandboxId": self.id}, timeout=timeout)
        return [AsyncProcess(self, ProcessInfo._from_json(p)) for p in d.get("processes") or []]

    async def trajectory(self, session_id: Optional[str] = None, *, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """The sandbox's trajectory log: every exec and file write as a
        numbered step (session, seq, method, request with payloads as their
        length and SHA-256, result or error, timing), in the order their
        outcomes were recorded; of one session, or of all when None. Each
        entry is the API's TrajectoryEntry as JSON (camelCase keys)."""
        out: List[Dict[str, Any]] = []
        body: Dict[str, Any] = {"sandboxId": self.id, "pageSize": 1000}
        if session_id:
            body["sessionId"] = session_id
        while True:
            d = await self.client._rpc(_SBX + "ReadTrajectory", body, timeout=timeout)
            out.extend(d.get("entries") or [])
            token = d.get("nextPageToken") or ""
            if not token:
                return out
            body["pageToken"] = token

    async def events(self, *, timeout: Optional[float] = None) -> List[SecurityEvent]:
        """The sandbox's security events, oldest first: every action the
        node contained or denied (OOM kills, forks refused at the pids
        limit, output past a cap, a full disk, timeout kills). The node
        keeps the latest 256 while the sandbox exists."""
        out: List[SecurityEvent] = []
        body: Dict[str, Any] = {"sandboxId": self.id, "pageSize": 1000}
        while True:
            d = await self.client._rpc(_SBX + "ListSandboxEvents", body, timeout=timeout)
            out.extend(SecurityEvent._from_json(e) for e in d.get("events") or [])
            token = d.get("nextPageToken") or ""
            if not token:
                return out
            body["pageToken"] = token

    def process(self, process_id: str) -> "AsyncProcess":
        """A handle on background process ``process_id`` without asking the daemon."""
        return AsyncProcess(self, ProcessInfo(sandbox_id=self.id, process_id=process_id, running=True))

    # -- files -----------------------------------------------------------

    async def read_file(
        self,
        path: str,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        max_bytes: Optional[int] = READ_MAX_BYTES,
        timeout: Optional[float] = None,
    ) -> bytes:
        """Read a file into memory: all of it from ``offset``, or ``length``
        bytes (fewer at the end of the file).

        A file is whatever the sandbox made it, a 2 GiB sparse file costs
        the sandbox nothing: more than ``max_bytes`` (default 256 MiB) raises
        :class:`ExhaustedError` (``limit == "max_bytes"``) after the first
        call says the size, before the rest is read. Stream big files with
        :meth:`read_file_to` or :meth:`iter_file`; ``max_bytes=None`` lifts
        the cap."""
        out = bytearray()
        async for chunk in self.iter_file(path, offset=offset, length=length, max_bytes=max_bytes, timeout=timeout):
            out += chunk
        return bytes(out)

    async def iter_file(
        self,
        path: str,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        max_bytes: Optional[int] = None,
        chunk_size: int = _READ_CHUNK,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[bytes]:
        """Yield a file's content in chunks of at most ``chunk_size`` (8 MiB)
        bytes, one ReadFile call each (``timeout`` is per call), so the
        client holds one chunk at a time. ``offset``/``length`` as for
        :meth:`read_file`; ``max_bytes`` (default: none) raises
        :class:`ExhaustedError` before the first chunk if the file is larger,
        or as soon as more arrives (a file that grows)."""
        if offset < 0 or (length is not None and length < 0):
            raise ValueError("offset and length must not be negative")
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        what = f"read of {path} in sandbox {self.id}"
        got = 0
        pos = offset
        first = True
        while True:
            want = chunk_size if length is None else min(chunk_size, length - got)
            if want <= 0:
                return
            if max_bytes is not None:
                want = min(want, max_bytes - got + 1)  # one byte more tells "larger"
            body = {"sandboxId": self.id, "path": path, "offset": str(pos), "length": str(want)}
            d = await self.client._rpc(_SBX + "ReadFile", body, timeout=timeout)
            if first and max_bytes is not None and "size" in d:
                size = max(0, int(d["size"]) - offset)
                if length is not None:
                    size = min(size, length)
                if size > max_bytes:
                    raise _archive.exhausted(what, "max_bytes", max_bytes, f"the file has {size:,} bytes to read")
            first = False
            chunk = base64.b64decode(d.get("content") or "")
            got += len(chunk)
            pos += len(chunk)
            if max_bytes is not None and got > max_bytes:
                raise _archive.exhausted(what, "max_bytes", max_bytes, "the file grew while it was read")
            if chunk:
                yield chunk
            if d.get("eof") or not chunk:
                return

    async def read_file_to(
        self,
        path: str,
        dest: Sink,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        max_bytes: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> int:
        """Stream a file of the sandbox into ``dest`` (a local path, created
        or truncated, written with holes for all-zero 4 KiB blocks; or a
        binary file object, written from its position) and return the bytes
        read. Memory stays at one chunk (see :meth:`iter_file`, which takes
        the same ``offset``, ``length`` and ``max_bytes``). A local path
        this call created is removed if the read fails."""
        chunks = self.iter_file(path, offset=offset, length=length, max_bytes=max_bytes, timeout=timeout)
        if not isinstance(dest, (str, os.PathLike)):
            n = 0
            async for chunk in chunks:
                dest.write(chunk)
                n += len(chunk)
            return n
        fd, done = _archive.open_local_file(f"read_file_to {os.fspath(dest)!r}", dest)
        ok = False
        try:
            w = _archive.HoleWriter(fd)
            async for chunk in chunks:
                w.write(chunk)
            w.finish()
            ok = True
            return w.off
        finally:
            os.close(fd)
            done(not ok)

    async def read_text(self, path: str, *, encoding: str = "utf-8", timeout: Optional[float] = None) -> str:
        """Read a whole file as text."""
        return (await self.read_file(path, timeout=timeout)).decode(encoding)

    async def write_file(
        self,
        path: str,
        data: Data,
        *,
        mode: Optional[int] = None,
        append: bool = False,
        make_parents: bool = False,
        timeout: Optional[float] = None,
    ) -> None:
        """Write (or append to) a file; str is encoded as UTF-8. ``mode``
        defaults to 0o644 for new files. Writes are retried on transient
        failures, appends are not (they are not idempotent)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if len(raw) > _WRITE_INLINE_MAX and not append:
            parent, name = posixpath.split(posixpath.normpath(path))
            if not make_parents and parent not in ("", "/"):
                st = await self.stat(parent, timeout=timeout)
                if not st.is_dir:
                    raise NotFoundError(f"{parent} is not a directory")
            tar = _archive.single_file_tar(name, raw, mode if mode is not None else 0o644)
            await self.upload_tar(tar, parent or "/", timeout=timeout)
            return
        chunks = [raw] if len(raw) <= _WRITE_INLINE_MAX else [
            raw[i : i + _WRITE_INLINE_MAX] for i in range(0, len(raw), _WRITE_INLINE_MAX)
        ]
        for chunk in chunks:
            body: Dict[str, Any] = {"sandboxId": self.id, "path": path, "content": _b64(chunk)}
            if mode is not None:
                body["mode"] = int(mode)
            if append:
                body["append"] = True
            if make_parents:
                body["makeParents"] = True
            hit = self._step(body, "write_file", chunk)
            if hit is not None:
                assert self._rollout is not None  # a hit comes from it
                self._rollout._outcome(hit)
                continue
            # A numbered append is safe to retry: the log replays it.
            d = await self.client._rpc(_SBX + "WriteFile", body, timeout=timeout, idempotent=not append or "seq" in body)
            self._stepped(d.get("replayed"))

    async def list_files(
        self, path: str, *, page_size: Optional[int] = None, timeout: Optional[float] = None
    ) -> List[FileInfo]:
        """List a directory (all of it: the daemon's pages are gathered; see
        :meth:`iter_files` to go through a huge directory in bounded
        memory). The order is the directory's own, not sorted."""
        return [f async for f in self.iter_files(path, page_size=page_size, timeout=timeout)]

    async def iter_files(
        self, path: str, *, page_size: Optional[int] = None, timeout: Optional[float] = None
    ) -> AsyncIterator[FileInfo]:
        """Yield a directory's entries, one ListFiles page (``page_size``,
        daemon default 1,000, at most 10,000) at a time; ``timeout`` is per
        page."""
        token = ""
        seen = set()
        while True:
            files, token = await self.list_files_page(path, page_token=token, page_size=page_size, timeout=timeout)
            for f in files:
                yield f
            if not token:
                return
            if token in seen:
                raise InternalError(f"ListFiles of {path}: the daemon sent page token {token!r} twice")
            seen.add(token)

    async def list_files_page(
        self,
        path: str,
        *,
        page_token: str = "",
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Tuple[List[FileInfo], str]:
        """One page of a directory listing: its entries and the token of the
        next page ("" after the last). Pass the token back, with the same
        ``path``, for the next page."""
        body: Dict[str, Any] = {"sandboxId": self.id, "path": path}
        if page_size:
            body["pageSize"] = int(page_size)
        if page_token:
            body["pageToken"] = page_token
        d = await self.client._rpc(_SBX + "ListFiles", body, timeout=timeout)
        return [FileInfo._from_json(f) for f in d.get("files") or []], str(d.get("nextPageToken") or "")

    async def stat(self, path: str, *, timeout: Optional[float] = None) -> FileInfo:
        """Describe a file (symlinks are not followed)."""
        d = await self.client._rpc(_SBX + "StatFile", {"sandboxId": self.id, "path": path}, timeout=timeout)
        return FileInfo._from_json(d)

    def watch_dir(self, path: str, *, recursive: bool = False, timeout: float = 86400.0) -> "DirWatch":
        """Follow the changes of a directory (and, with ``recursive``, of
        every directory below it, those made later included): an async
        iterator of :class:`FileEvent`, live. The watch is set once the
        first event is awaited (or on ``async with``); it ends when the
        directory is removed (the iteration stops), at ``timeout`` (seconds,
        default a day), or when the sandbox stops running (pause,
        hibernate, delete: :class:`UnavailableError`)::

            async with sbx.watch_dir("/work", recursive=True) as w:
                async for ev in w:
                    print(ev.type, ev.path)
        """
        return DirWatch(self, {"sandboxId": self.id, "path": path, "recursive": bool(recursive)}, _positive("timeout", timeout))

    async def stats(self, *, timeout: Optional[float] = None) -> SandboxStats:
        """Read the sandbox's resource use now (it must be running)."""
        d = await self.client._rpc(_SBX + "SandboxStats", {"sandboxId": self.id}, timeout=timeout)
        return SandboxStats._from_json(d)

    async def exists(self, path: str, *, timeout: Optional[float] = None) -> bool:
        try:
            await self.stat(path, timeout=timeout)
        except NotFoundError:
            return False
        return True

    async def mkdir(
        self, path: str, *, mode: Optional[int] = None, parents: bool = False, timeout: Optional[float] = None
    ) -> None:
        """Create a directory (``parents``: like ``mkdir -p``)."""
        body: Dict[str, Any] = {"sandboxId": self.id, "path": path}
        if mode is not None:
            body["mode"] = int(mode)
        if parents:
            body["parents"] = True
        hit = self._step(body, "make_dir")
        try:
            if hit is not None:
                assert self._rollout is not None  # a hit comes from it
                self._rollout._outcome(hit)
                return
            d = await self.client._rpc(_SBX + "MakeDir", body, timeout=timeout, idempotent=True)
            self._stepped(d.get("replayed"))
        except ConflictError as e:
            if e.after_ambiguous_failure and (await self.stat(path, timeout=timeout)).is_dir:
                return  # made by our own earlier attempt
            raise

    async def remove(
        self, path: str, *, recursive: bool = False, missing_ok: bool = False, timeout: Optional[float] = None
    ) -> None:
        """Remove a file, or a directory (non-empty ones need ``recursive``)."""
        body: Dict[str, Any] = {"sandboxId": self.id, "path": path}
        if recursive:
            body["recursive"] = True
        hit = self._step(body, "remove_file")
        try:
            if hit is not None:
                assert self._rollout is not None  # a hit comes from it
                self._rollout._outcome(hit)
                return
            d = await self.client._rpc(_SBX + "RemoveFile", body, timeout=timeout, idempotent=True)
            self._stepped(d.get("replayed"))
        except NotFoundError as e:
            if missing_ok or e.after_ambiguous_failure:
                return
            raise

    def _archive_path(self) -> str:
        return "/v1/sandboxes/" + self.id + "/archive"

    async def upload(self, local_path: PathLike, remote_dir: str, *, timeout: Optional[float] = None) -> None:
        """Copy a local directory's contents (or a single file) into the
        directory ``remote_dir`` of the sandbox (created if missing), as a
        tar stream."""
        loop = asyncio.get_running_loop()
        spool = await loop.run_in_executor(None, _archive.build_tar, local_path)
        try:
            await self.upload_tar(spool, remote_dir, timeout=timeout)  # type: ignore[arg-type]
        finally:
            spool.close()

    async def upload_tar(
        self, tar: Union[bytes, bytearray, memoryview, BinaryIO], remote_dir: str, *, timeout: Optional[float] = None
    ) -> None:
        """Extract a tar stream (bytes or a seekable binary file; plain or
        gzipped) into the directory ``remote_dir`` of the sandbox."""
        body: Callable[[], Any]
        if isinstance(tar, (bytes, bytearray, memoryview)):
            data = bytes(tar)
            body = lambda: data  # noqa: E731
        else:
            f = tar
            body = lambda: _archive.iter_file(f)  # noqa: E731
        params = {"path": remote_dir}
        self._step(params)
        if "seq" in params:
            params["session"] = params.pop("sessionId")
        await self.client._t.http(
            "PUT",
            self._archive_path(),
            params=params,
            body=body,
            content_type="application/x-tar",
            timeout=timeout if timeout is not None else self.client.transfer_timeout,
            idempotent=True,
        )

    async def _get_archive(
        self, remote_path: str, handle: Callable[[aiohttp.ClientResponse], Awaitable[T]], timeout: Optional[float],
        *, idempotent: bool = True, sparse: bool = False,
    ) -> T:
        """GET the archive of ``remote_path``; ``handle`` consumes the body
        (called again on a retry). ``sparse``: files with holes come as PAX
        sparse entries, which tarfile reads. A local file system error from
        the handler is raised as the OSError it is (not retried)."""
        params = {"path": remote_path}
        if sparse:
            params["sparse"] = "1"
        try:
            out = await self.client._t.http(
                "GET",
                self._archive_path(),
                params=params,
                handle=handle,
                timeout=timeout if timeout is not None else self.client.transfer_timeout,
                idempotent=idempotent,
            )
        except _archive.LocalError as e:
            raise e.error from None
        return out  # type: ignore[return-value]

    async def download_tar(
        self, remote_path: str, *, max_bytes: Optional[int] = READ_MAX_BYTES, sparse: bool = False,
        timeout: Optional[float] = None,
    ) -> bytes:
        """``remote_path`` (a directory tree or one file) as tar bytes in
        memory. A directory's entries are named relative to it. A stream
        longer than ``max_bytes`` (default 256 MiB) raises
        :class:`ExhaustedError` and is cut; stream big trees with
        :meth:`download_tar_to` or :meth:`download`. Files with holes travel
        expanded unless ``sparse``: then as PAX sparse entries (only their
        data), which tarfile, GNU tar and bsdtar read and busybox tar does
        not."""
        what = f"download_tar of {remote_path} from sandbox {self.id}"

        async def handle(resp: aiohttp.ClientResponse) -> bytes:
            buf = bytearray()
            async for chunk in resp.content.iter_chunked(_archive.CHUNK):
                if max_bytes is not None and len(buf) + len(chunk) > max_bytes:
                    raise _archive.exhausted(what, "max_bytes", max_bytes, "the tar stream is longer")
                buf += chunk
            return bytes(buf)

        return await self._get_archive(remote_path, handle, timeout, sparse=sparse)

    async def download_tar_to(
        self, remote_path: str, dest: Sink, *, max_bytes: Optional[int] = None, sparse: bool = False,
        timeout: Optional[float] = None,
    ) -> int:
        """Stream the tar of ``remote_path`` into ``dest`` (a local path,
        created or truncated; or a binary file object, written from its
        position) and return its length. Nothing is extracted. ``max_bytes``
        (default: none) cuts the stream with :class:`ExhaustedError`.
        ``sparse``: files with holes as PAX sparse entries (see
        :meth:`download_tar`). A broken stream is retried from the start
        when ``dest`` is a path or a seekable file; a path this call created
        is removed on failure."""
        what = f"download_tar_to of {remote_path} from sandbox {self.id}"
        local = isinstance(dest, (str, os.PathLike))
        fobj: Any = dest
        seekable = local or bool(getattr(fobj, "seekable", lambda: False)())
        start = fobj.tell() if seekable and not local else 0
        fd, done = _archive.open_local_file(what, dest) if local else (-1, None)  # type: ignore[arg-type]

        async def handle(resp: aiohttp.ClientResponse) -> int:
            n = 0
            try:
                if local:
                    os.lseek(fd, 0, os.SEEK_SET)
                    os.ftruncate(fd, 0)
                elif seekable:
                    fobj.seek(start)
                    fobj.truncate()
                async for chunk in resp.content.iter_chunked(_archive.CHUNK):
                    n += len(chunk)
                    if max_bytes is not None and n > max_bytes:
                        raise _archive.exhausted(what, "max_bytes", max_bytes, "the tar stream is longer")
                    if local:
                        mv = memoryview(chunk)
                        while mv:
                            mv = mv[os.write(fd, mv) :]
                    else:
                        fobj.write(chunk)
            except OSError as e:
                if isinstance(e, aiohttp.ClientError):
                    raise
                raise _archive.LocalError(e) from e
            return n

        ok = False
        try:
            n = await self._get_archive(remote_path, handle, timeout, idempotent=seekable, sparse=sparse)
            ok = True
            return n
        finally:
            if done is not None:
                os.close(fd)
                done(not ok)

    async def download(
        self,
        remote_path: str,
        local_dir: PathLike,
        *,
        max_bytes: Optional[int] = _archive.DEFAULT_MAX_BYTES,
        max_entries: Optional[int] = _archive.DEFAULT_MAX_ENTRIES,
        preserve: bool = False,
        symlinks_as_is: bool = False,
        xattr_allow: Sequence[str] = (),
        timeout: Optional[float] = None,
    ) -> DownloadStats:
        """Copy ``remote_path`` of the sandbox (a directory's contents, or a
        single file) into the local directory ``local_dir`` (created if
        missing), extracting while it downloads, and say what was written.

        The tree is the sandbox's, so it is treated as hostile (the same
        rules as ``warren sandbox cp`` and the Go SDK's ``DownloadTo``):

        - no symlink is ever followed: not in ``local_dir``'s own path
          (:class:`InvalidError`: pass ``os.path.realpath(local_dir)`` if you
          trust its links), not one the archive made (an entry under one is
          refused);
        - symlinks are kept as links, and only if their target cannot lead
          outside ``local_dir`` (relative, ``..`` only at its start and no
          more of them than the link's depth), else :class:`InvalidError`;
          ``symlinks_as_is=True`` keeps every link as written (whoever opens
          files of the tree then follows them);
        - hard links only to files of the same download;
        - no owners, ACLs or xattrs (``xattr_allow``: name prefixes to keep,
          e.g. ``["user."]``); permission bits masked with 0o755 (setuid,
          setgid, sticky, group/other write dropped; directories keep
          owner rwx) unless ``preserve``; only what the download created
          gets metadata;
        - devices and FIFOs skipped (counted); holes kept;
        - budgets: ``max_bytes`` of file content (apparent size, default
          1 GiB) and ``max_entries`` (default 1,000,000); beyond either,
          :class:`ExhaustedError` with ``.limit`` naming it (``None`` lifts
          it);
        - on any error what the download made is removed again (a name that
          existed in ``local_dir`` and was replaced stays replaced; a
          directory is never replaced by a file: :class:`ConflictError`);
          local file system errors are raised as OSError.

        Nothing is held in memory: the archive is extracted as it arrives
        (a few MiB in flight). A broken stream is retried from scratch."""
        what = f"download of {remote_path} from sandbox {self.id}"
        opts: Dict[str, Any] = dict(
            max_bytes=max_bytes, max_entries=max_entries, preserve=preserve,
            symlinks_as_is=symlinks_as_is, xattr_allow=tuple(xattr_allow), what=what,
        )
        for limit in ("max_bytes", "max_entries"):
            if opts[limit] is not None and opts[limit] < 0:
                raise ValueError(f"{limit} must not be negative")

        async def handle(resp: aiohttp.ClientResponse) -> DownloadStats:
            return await _archive.run_fed(resp, lambda pipe: _archive.extract(pipe, local_dir, **opts))

        # Holes stay holes on the wire too: only a sparse file's data comes.
        return await self._get_archive(remote_path, handle, timeout, sparse=True)


# ---------------------------------------------------------------------------
# Streaming exec
# ---------------------------------------------------------------------------


class _EventStream:
    """What a streaming call's iterator shares: closing, draining to the
    result, and ``async with``. Subclasses set ``_gen``, ``_done`` and
    ``result``."""

    _gen: Any
    _done: bool
    result: Optional[ExecResult]

    async def _receive(self, ended_without_result: str) -> Dict[str, Any]:
        """The next message of the open stream. The stream ending before
        its result is Unavailable (the daemon went away); any failure ends
        the iteration."""
        try:
            return await self._gen.__anext__()  # type: ignore[no-any-return]
        except StopAsyncIteration:
            self._done = True
            if self.result is None:
                raise UnavailableError(ended_without_result, code="unavailable") from None
            raise
        except BaseException:
            self._done = True
            raise

    async def aclose(self) -> None:
        """Stop reading the stream: an exec's command is stopped with it, a
        process attach only detaches (the process runs on)."""
        self._done = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await gen.aclose()

    async def wait(self) -> ExecResult:
        """Consume the rest of the stream and return the result."""
        async for _ in self:  # type: ignore[attr-defined]
            pass
        assert self.result is not None
        return self.result

    async def __aenter__(self: "_ES") -> "_ES":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


_ES = TypeVar("_ES", bound=_EventStream)


class ExecStream(_EventStream):
    """A running streaming exec: an async iterator of :class:`ExecEvent`.

    The last event carries the :class:`ExecResult` (also in ``result``
    afterwards), with the streamed output gathered into its stdout and
    stderr. :meth:`aclose` (or leaving ``async with``) stops the command if
    it still runs. With ``pty=True``, :meth:`resize` changes the terminal's
    size while it runs."""

    def __init__(self, sandbox: AsyncSandbox, body: Dict[str, Any], deadline: float, command: Command) -> None:
        self.sandbox = sandbox
        self._body = body
        self._deadline = deadline
        self._command = command
        self._gen: Optional[AsyncGenerator[Dict[str, Any], None]] = None
        self._done = False
        self._stdout = bytearray()
        self._stderr = bytearray()
        #: The result, once the stream ended.
        self.result: Optional[ExecResult] = None
        #: With ``pty=True``: the id :meth:`resize` uses ("e-1"...), from the
        #: stream's first message (before the first output event).
        self.process_id: Optional[str] = None

    def __aiter__(self) -> "ExecStream":
        return self

    async def __anext__(self) -> ExecEvent:
        if self._done:
            raise StopAsyncIteration
        if self._gen is None:
            self._gen = self.sandbox.client._t.server_stream(
                _SBX + "ExecStream", self._body, timeout=self._deadline, idempotent=True
            )
        msg = await self._receive("exec stream ended without a result")
        if "result" in msg:
            r = ExecResult._from_json(msg["result"])._with_output(bytes(self._stdout), bytes(self._stderr))
            self.result = r
            self._done = True
            self.sandbox._stepped(r.replayed)
            # Read the end of the stream so the connection goes back to the
            # pool (and an error after the result is not missed).
            try:
                await self._gen.__anext__()
            except StopAsyncIteration:
                self._gen = None
            finally:
                await self.aclose()
            self.sandbox.client._check_truncation(r, self._command)
            return ExecEvent(result=r)
        if msg.get("stdout"):
            b = base64.b64decode(msg["stdout"])
            self._stdout += b
            return ExecEvent(stdout=b)
        if msg.get("stderr"):
            b = base64.b64decode(msg["stderr"])
            self._stderr += b
            return ExecEvent(stderr=b)
        if "started" in msg:
            self.process_id = msg["started"].get("processId") or None
        return await self.__anext__()  # started, or an empty event: skip it

    async def resize(self, rows: int, cols: int, *, timeout: Optional[float] = None) -> None:
        """Set the terminal size of the running command (``pty=True``); the
        command gets SIGWINCH. Call it once the first event arrived; after
        the command exited it raises :class:`NotFoundError`."""
        if not self._body.get("pty"):
            raise ValueError("resize needs exec_stream(..., pty=True)")
        if self.process_id is None:
            raise ConflictError(
                "resize: the command has not started yet: read the stream's first event first",
                code="failed_precondition",
                category="conflict",
            )
        body = {"sandboxId": self.sandbox.id, "processId": self.process_id, "rows": int(rows), "cols": int(cols)}
        await self.sandbox.client._rpc(_SBX + "ResizeProcess", body, timeout=timeout)


# ---------------------------------------------------------------------------
# Image pulls
# ---------------------------------------------------------------------------


class ImagePull:
    """A running :meth:`AsyncWarren.pull_image`.

    Await it for the :class:`Image` (the progress callback, if any, sees
    every event), or iterate over its :class:`PullEvent` objects: the last
    one carries the image, which is also in ``image`` afterwards. Leaving
    ``async with`` (or :meth:`aclose`) before the end closes the request and
    the daemon stops the import."""

    def __init__(
        self,
        client: AsyncWarren,
        body: Dict[str, Any],
        timeout: float,
        progress: Optional[PullProgress] = None,
    ) -> None:
        self.client = client
        self._body = body
        self._timeout = timeout
        self._progress = progress
        self._gen: Optional[AsyncGenerator[Dict[str, Any], None]] = None
        self._got_message = False  # the current stream attempt yielded a message
        self._deadline: Optional[float] = None
        self._done = False
        #: The image, once the pull finished.
        self.image: Optional[Image] = None
        #: How many times a broken stream was started over.
        self.restarts = 0

    @property
    def ref(self) -> str:
        return str(self._body["ref"])

    def __repr__(self) -> str:
        return f"<ImagePull {self.ref}{' done' if self.image is not None else ''}>"

    def __await__(self) -> Generator[Any, None, Image]:
        return self.wait().__await__()

    def __aiter__(self) -> "ImagePull":
        return self

    async def __anext__(self) -> PullEvent:
        if self._done:
            raise StopAsyncIteration
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._timeout
        while True:
            if self._gen is None:
                left = self._deadline - loop.time()
                if left <= 0:
                    self._done = True
                    raise TimeoutError(
                        f"pull {self.ref}: client deadline of {self._timeout:g}s passed", timeout=self._timeout
                    )
                self._got_message = False
                self._gen = self.client._t.server_stream(_IMG + "PullImage", self._body, timeout=left, idempotent=True)
            try:
                msg = await self._gen.__anext__()
            except StopAsyncIteration:
                self._done = True
                self._gen = None
                raise UnavailableError(f"pull {self.ref}: stream ended without the image", code="unavailable") from None
            except UnavailableError as e:
                # The transport retried failures before the first message;
                # a stream that broke later is started over (a pull is
                # idempotent) while attempts and time are left.
                self._gen = None
                if self.restarts > 0:
                    e.after_ambiguous_failure = True
                if not self._got_message or not await self._backoff():
                    self._done = True
                    raise
                continue
            except BaseException as e:
                self._done = True
                self._gen = None
                if isinstance(e, WarrenError) and self.restarts > 0:
                    e.after_ambiguous_failure = True
                raise
            self._got_message = True
            ev = PullEvent._from_json(msg)
            if ev.image is not None:
                self.image = ev.image
                self._done = True
                # Read the end of the stream so the connection goes back to
                # the pool (and an error after the image is not missed).
                try:
                    await self._gen.__anext__()
                except StopAsyncIteration:
                    self._gen = None
                finally:
                    await self.aclose()
            if self._progress is not None:
                res = self._progress(ev)
                if inspect.isawaitable(res):
                    await res
            return ev

    async def _backoff(self) -> bool:
        """Sleep before starting the stream over; False when no attempt or
        time is left."""
        policy = self.client.retry
        if self.restarts + 1 >= policy.max_attempts:
            return False
        self.restarts += 1
        delay = policy.backoff(self.restarts)
        loop = asyncio.get_running_loop()
        assert self._deadline is not None
        if loop.time() + delay >= self._deadline:
            return False
        log.info("pull %s: stream broke, starting over (attempt %d)", self.ref, self.restarts + 1)
        await asyncio.sleep(delay)
        return True

    async def aclose(self) -> None:
        """Stop the pull (the daemon stops importing) if it still runs."""
        self._done = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await gen.aclose()

    async def wait(self) -> Image:
        """Consume the rest of the events and return the image."""
        try:
            async for _ in self:
                pass
        finally:
            await self.aclose()
        if self.image is None:  # pragma: no cover - __anext__ raises instead
            raise UnavailableError(f"pull {self.ref}: stream ended without the image", code="unavailable")
        return self.image

    async def __aenter__(self) -> "ImagePull":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


# ---------------------------------------------------------------------------
# Background processes
# ---------------------------------------------------------------------------


class AsyncProcess:
    """A background process of a sandbox (see :meth:`AsyncSandbox.start`)."""

    def __init__(self, sandbox: AsyncSandbox, info: ProcessInfo) -> None:
        self.sandbox = sandbox
        self.info = info

    @property
    def id(self) -> str:
        """The process handle, e.g. ``"p-1"``."""
        return self.info.process_id

    @property
    def pid(self) -> int:
        """The pid inside the sandbox."""
        return self.info.pid

    def __repr__(self) -> str:
        return f"<AsyncProcess {self.sandbox.id}/{self.id} pid={self.pid}>"

    def _body(self, **extra: Any) -> Dict[str, Any]:
        return dict({"sandboxId": self.sandbox.id, "processId": self.id}, **extra)

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Wait for the process to exit and return its result. ``timeout``
        (default: the client's ``exec_timeout``) bounds the wait; when it
        passes :class:`DeadlineExceededError` is raised and the process keeps
        running."""
        t = _positive("timeout", timeout) if timeout is not None else self.sandbox.client.exec_timeout
        d = await self.sandbox.client._rpc(
            _SBX + "WaitProcess",
            self._body(timeoutMs=_ms(t)),
            timeout=self.sandbox.client._exec_deadline(t),
        )
        r = ExecResult._from_json(d)
        self.sandbox.client._check_truncation(r, list(self.info.argv))
        return r

    async def signal(self, sig: int = _signal.SIGTERM, *, group: bool = False, timeout: Optional[float] = None) -> None:
        """Send a signal (default SIGTERM) to the process, or to its whole
        process group. ConflictError if it has exited."""
        await self.sandbox.client._rpc(
            _SBX + "SignalProcess", self._body(signal=int(sig), group=group), timeout=timeout, idempotent=False
        )

    async def kill(self, *, timeout: Optional[float] = None) -> None:
        """SIGKILL the process group; an exited process is fine."""
        try:
            await self.signal(_signal.SIGKILL, group=True, timeout=timeout)
        except ConflictError:
            pass

    async def write_stdin(self, data: Data, *, close: bool = False, timeout: Optional[float] = None) -> None:
        """Write to the process's stdin (and close it with ``close``). Blocks
        while the process does not read. Not retried once sent."""
        body = self._body()
        if data:
            body["data"] = _b64(data)
        if close:
            body["close"] = True
        await self.sandbox.client._rpc(_SBX + "WriteStdin", body, timeout=timeout, idempotent=False)

    async def close_stdin(self, *, timeout: Optional[float] = None) -> None:
        await self.write_stdin(b"", close=True, timeout=timeout)

    def attach(self, stdout_offset: int = 0, stderr_offset: int = 0, *, timeout: float = 86400.0) -> "ProcessAttach":
        """Follow the process's output: an async iterator of
        :class:`ProcessEvent`, from the given offsets (what is still kept of
        them; -1 skips a stream), then live, then the exit as the last
        event. Any number of attaches may run at once, also after a daemon
        restart; closing one (or leaving ``async with``) detaches, and the
        process runs on; so does the end of ``timeout`` (seconds, default a
        day)::

            async with proc.attach() as a:
                async for ev in a:
                    if ev.stream == "stdout":
                        print(ev.data.decode(), end="")
        """
        body = self._body(stdoutOffset=str(int(stdout_offset)), stderrOffset=str(int(stderr_offset)))
        return ProcessAttach(self, body, _positive("timeout", timeout))

    async def resize(self, rows: int, cols: int, *, timeout: Optional[float] = None) -> None:
        """Set the terminal size of a process started with ``pty=True``."""
        await self.sandbox.client._rpc(
            _SBX + "ResizeProcess", self._body(rows=int(rows), cols=int(cols)), timeout=timeout
        )

    async def refresh(self, *, timeout: Optional[float] = None) -> ProcessInfo:
        """Ask the daemon for the process's current state."""
        for p in await self.sandbox.processes(timeout=timeout):
            if p.id == self.id:
                self.info = p.info
                return p.info
        raise NotFoundError(f"process {self.id} not found in sandbox {self.sandbox.id}", code="not_found")


class ProcessAttach(_EventStream):
    """An attach to a background process: an async iterator of
    :class:`ProcessEvent` (see :meth:`AsyncProcess.attach`). ``result``
    holds the exit once the stream ended."""

    def __init__(self, proc: AsyncProcess, body: Dict[str, Any], timeout: float) -> None:
        self.process = proc
        self._body = body
        self._timeout = timeout
        self._gen: Optional[AsyncGenerator[Dict[str, Any], None]] = None
        self._done = False
        #: The exit (an ExecResult without output), once the stream ended.
        self.result: Optional[ExecResult] = None

    def __aiter__(self) -> "ProcessAttach":
        return self

    async def __anext__(self) -> ProcessEvent:
        if self._done:
            raise StopAsyncIteration
        if self._gen is None:
            self._gen = self.process.sandbox.client._t.server_stream(
                _SBX + "AttachProcess", self._body, timeout=self._timeout, idempotent=True
            )
        msg = await self._receive("attach stream ended without the exit")
        if "exit" in msg:
            self.result = ExecResult._from_json(msg["exit"])
            self._done = True
            try:
                await self._gen.__anext__()
            except StopAsyncIteration:
                self._gen = None
            finally:
                await self.aclose()
            return ProcessEvent(stream="exit", result=self.result)
        for name in ("stdout", "stderr"):
            c = msg.get(name)
            if c is not None:
                return ProcessEvent(stream=name, data=base64.b64decode(c.get("data") or ""), offset=_int_of(c.get("offset")))
        return await self.__anext__()


class DirWatch:
    """A watch of a sandbox directory: an async iterator of
    :class:`FileEvent` (see :meth:`AsyncSandbox.watch_dir`). Closing it (or
    leaving ``async with``) ends the watch."""

    def __init__(self, sandbox: AsyncSandbox, body: Dict[str, Any], timeout: float) -> None:
        self.sandbox = sandbox
        self._body = body
        self._timeout = timeout
        self._gen: Optional[AsyncGenerator[Dict[str, Any], None]] = None
        self._done = False
        #: The watched directory as the daemon resolved it, once started.
        self.path: Optional[str] = None

    async def start(self) -> None:
        """Set the watch (wait for the daemon's started event): changes
        made after this are seen."""
        if self._gen is not None or self._done:
            return
        self._gen = self.sandbox.client._t.server_stream(_SBX + "WatchDir", self._body, timeout=self._timeout, idempotent=True)
        msg = await self._next()
        if msg is None or "started" not in msg:
            await self.aclose()
            raise UnavailableError("watch stream ended before it started", code="unavailable")
        self.path = (msg.get("started") or {}).get("path", "")

    async def _next(self) -> Optional[Dict[str, Any]]:
        assert self._gen is not None
        try:
            return await self._gen.__anext__()
        except StopAsyncIteration:
            self._done = True
            return None
        except BaseException:
            self._done = True
            raise

    def __aiter__(self) -> "DirWatch":
        return self

    async def __anext__(self) -> FileEvent:
        await self.start()
        while not self._done:
            msg = await self._next()
            if msg is None:
                break
            if "file" in msg:
                return FileEvent._from_json(msg["file"])
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """End the watch."""
        self._done = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await gen.aclose()

    async def wait(self) -> None:
        """Consume events until the watch ends."""
        async for _ in self:
            pass

    async def __aenter__(self) -> "DirWatch":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _set_pty(body: Dict[str, Any], pty: bool, rows: Optional[int], cols: Optional[int]) -> None:
    if pty:
        body["pty"] = True
        if rows:
            body["rows"] = int(rows)
        if cols:
            body["cols"] = int(cols)
    elif rows or cols:
        raise ValueError("rows and cols need pty=True")


def _int_of(v: Any) -> int:
    """An int64 field of the JSON form (a string, or absent for 0)."""
    return int(v) if v else 0


# ---------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------


class AsyncSandboxGroup(Sequence[AsyncSandbox]):
    """Sandboxes made by :meth:`AsyncWarren.create_many`. As an async context
    manager it deletes them all on exit. ``errors`` holds ``(index,
    exception)`` for the creations that failed."""

    def __init__(
        self,
        client: AsyncWarren,
        sandboxes: Sequence[AsyncSandbox],
        errors: Sequence[Tuple[int, BaseException]] = (),
    ) -> None:
        self.client = client
        self.sandboxes: List[AsyncSandbox] = list(sandboxes)
        self.errors: List[Tuple[int, BaseException]] = list(errors)

    @overload
    def __getitem__(self, i: int) -> AsyncSandbox: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[AsyncSandbox]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[AsyncSandbox, Sequence[AsyncSandbox]]:
        return self.sandboxes[i]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __iter__(self) -> Iterator[AsyncSandbox]:
        return iter(self.sandboxes)

    def __repr__(self) -> str:
        return f"<AsyncSandboxGroup {len(self.sandboxes)} sandboxes, {len(self.errors)} failed>"

    async def exec(self, command: Command, *, concurrency: Optional[int] = None, **exec_kwargs: Any) -> BatchResult[ExecResult]:
        """Run ``command`` in every sandbox; outcomes in sandbox order."""
        return await self.client.exec_many(
            [(sb, command) for sb in self.sandboxes], concurrency=concurrency, **exec_kwargs
        )

    async def map(
        self, fn: Callable[[AsyncSandbox], Awaitable[T]], *, concurrency: Optional[int] = None
    ) -> BatchResult[T]:
        """Await ``fn(sandbox)`` for every sandbox; outcomes in order."""
        return await self.client.map(fn, self.sandboxes, concurrency=concurrency)

    async def delete(self, *, concurrency: int = 32) -> BatchResult[None]:
        """Delete every sandbox of the group (missing ones are fine)."""
        return await map_bounded(lambda sb: sb.delete(missing_ok=True), self.sandboxes, concurrency)

    async def __aenter__(self) -> "AsyncSandboxGroup":
        return self

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        res = await _finish_despite_cancel(self.delete(), self.client.timeout + 120.0)
        for i, err in res.errors:
            log.warning("could not delete sandbox %s: %s", self.sandboxes[i].id, err)
        if res.errors and e is None:
            res.raise_for_errors()


__all__ += ["Outcome", "BatchError"]


def _raw(data: Optional[Data]) -> bytes:
    if not data:
        return b""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)
