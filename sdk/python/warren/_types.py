"""Typed views of the API's messages (api/warren/v1/warren.proto).

They are plain frozen dataclasses built from the Connect protocol's JSON
(proto3 JSON mapping: lowerCamelCase names, int64 as strings, bytes as
base64, zero values left out)."""

from __future__ import annotations

import base64
import datetime as _dt
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import CommandError

__all__ = [
    "SandboxState",
    "Resources",
    "SandboxInfo",
    "Rlimit",
    "RlimitsArg",
    "ExecResult",
    "ExecEvent",
    "ProcessInfo",
    "FileInfo",
    "DownloadStats",
    "Image",
    "Layer",
    "PullEvent",
    "LayerStat",
    "LayerVerification",
    "VersionInfo",
]


def _int(v: Any) -> int:
    if v is None or v == "":
        return 0
    return int(v)


def _b64(v: Any) -> bytes:
    if not v:
        return b""
    return base64.b64decode(v)


def _ms_to_datetime(ms: int) -> Optional[_dt.datetime]:
    if not ms:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000.0, tz=_dt.timezone.utc)


class SandboxState(str, enum.Enum):
    """The life cycle state of a sandbox (docs/ARCHITECTURE.md, "Death,
    delete, restart"). Only RUNNING sandboxes run commands, serve files,
    commit and update; other states refuse those with :class:`ConflictError`
    naming the state. Members are in wire-number order. A state number this
    SDK does not know (a newer daemon's) reads as UNSPECIFIED."""

    UNSPECIFIED = "SANDBOX_STATE_UNSPECIFIED"
    CREATING = "SANDBOX_STATE_CREATING"
    RUNNING = "SANDBOX_STATE_RUNNING"
    STOPPED = "SANDBOX_STATE_STOPPED"  #: init exited; resources released; delete to forget it
    DELETING = "SANDBOX_STATE_DELETING"
    PAUSED = "SANDBOX_STATE_PAUSED"  #: processes frozen, memory kept
    HIBERNATED = "SANDBOX_STATE_HIBERNATED"  #: saved to disk, nothing runs
    LOST = "SANDBOX_STATE_LOST"  #: the node cannot reach it now (retried); it may still run
    DEAD = "SANDBOX_STATE_STOPPED"  #: the old name of STOPPED (an alias)

    @classmethod
    def _parse(cls, v: Any) -> "SandboxState":
        if v is None or v == "":
            return cls.UNSPECIFIED
        if isinstance(v, int):
            return list(cls)[v] if 0 <= v < len(cls) else cls.UNSPECIFIED
        try:
            return cls(v)
        except ValueError:
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class Resources:
    """Resource limits of a sandbox. Zero means: the node's default (no CPU
    quota for ``cpu_millis``)."""

    cpu_millis: int = 0  #: 1000 = one core
    memory_bytes: int = 0
    pids_max: int = 0
    #: caps the writable layer (ENOSPC inside the sandbox only); at least 16 MiB
    disk_bytes: int = 0

    @classmethod
    def _from_json(cls, d: Optional[Mapping[str, Any]]) -> "Resources":
        d = d or {}
        return cls(
            cpu_millis=_int(d.get("cpuMillis")),
            memory_bytes=_int(d.get("memoryBytes")),
            pids_max=_int(d.get("pidsMax")),
            disk_bytes=_int(d.get("diskBytes")),
        )

    def _to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.cpu_millis:
            out["cpuMillis"] = str(int(self.cpu_millis))
        if self.memory_bytes:
            out["memoryBytes"] = str(int(self.memory_bytes))
        if self.pids_max:
            out["pidsMax"] = str(int(self.pids_max))
        if self.disk_bytes:
            out["diskBytes"] = str(int(self.disk_bytes))
        return out


@dataclass(frozen=True)
class Rlimit:
    """A resource limit of every process of a sandbox (``setrlimit(2)``, what
    ``ulimit`` shows). Names are the kernel's in lower case: ``cpu``,
    ``fsize``, ``data``, ``stack``, ``core``, ``rss``, ``nproc``, ``nofile``,
    ``memlock``, ``as``, ``locks``, ``sigpending``, ``msgqueue``, ``nice``,
    ``rtprio``, ``rttime``. :data:`UNLIMITED` (-1, like
    ``resource.RLIM_INFINITY``) means no limit."""

    UNLIMITED = -1

    name: str
    soft: int
    hard: int

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "Rlimit":
        return cls(name=d.get("name", ""), soft=_int(d.get("soft")), hard=_int(d.get("hard")))

    def _to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "soft": str(int(self.soft)), "hard": str(int(self.hard))}


#: What ``create(rlimits=...)`` takes: ``{"nofile": (1024, 4096), "core": -1}``
#: (an int is soft and hard; -1 is unlimited), or a sequence of :class:`Rlimit`.
RlimitsArg = Union[Mapping[str, Union[int, Tuple[int, int]]], Sequence[Rlimit]]


def _rlimit_list(rlimits: Optional[RlimitsArg]) -> List[Rlimit]:
    """Checks the shape of ``create(rlimits=...)``; the daemon checks the
    names and values (an unknown name, soft above hard, or a hard limit
    above the daemon's own is :class:`~warren.InvalidError`)."""
    if rlimits is None:
        return []
    if isinstance(rlimits, (str, bytes)):
        raise TypeError("rlimits must be a mapping of name to limit or a sequence of Rlimit, not a string")
    out: List[Rlimit] = []
    if isinstance(rlimits, Mapping):
        for name, v in rlimits.items():
            if isinstance(v, tuple) and len(v) == 2:
                soft, hard = v
            elif isinstance(v, int) and not isinstance(v, bool):
                soft = hard = v
            else:
                raise TypeError(f"rlimit {name!r}: want an int or a (soft, hard) tuple, got {v!r}")
            out.append(Rlimit(str(name), soft, hard))
    else:
        for r in rlimits:
            if not isinstance(r, Rlimit):
                raise TypeError(f"rlimits: want Rlimit items, got {r!r}")
            out.append(r)
    for r in out:
        for v in (r.soft, r.hard):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"rlimit {r.name!r}: limits are ints, got {v!r}")
            if v < -1:
                raise ValueError(f"rlimit {r.name!r}: {v} is negative (-1 = unlimited)")
    return out


@dataclass(frozen=True)
class NetworkRule:
    """One destination an ``allowlist`` policy allows: an IPv4 CIDR (or an
    address alone) or a ``host`` name (``"pypi.org"``, or
    ``"*.pythonhosted.org"`` for every name under it: the addresses
    Warren's resolver answers the sandbox for it), optionally one port
    (1-65535; None = every port) and protocol (``"tcp"``, ``"udp"``;
    ``""`` = both)."""

    cidr: str = ""
    port: Optional[int] = None
    protocol: str = ""
    host: str = ""

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "NetworkRule":
        port = d.get("port")
        return cls(cidr=d.get("cidr", ""), port=None if port is None else int(port), protocol=d.get("protocol", ""),
                   host=d.get("host", ""))

    def _to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"host": self.host} if self.host else {"cidr": self.cidr}
        if self.port is not None:
            out["port"] = int(self.port)
        if self.protocol:
            out["protocol"] = self.protocol
        return out


@dataclass(frozen=True)
class NetworkPolicy:
    """What a sandbox may reach. ``mode``: ``"none"`` (loopback only, the
    default), ``"open"`` (NAT out through the node) or ``"allowlist"``
    (only the destinations in ``allow``). In every mode the node's own
    services, link-local and metadata addresses and other sandboxes stay
    out of reach. :meth:`parse` reads the CLI's spelling."""

    mode: str = "none"
    allow: Tuple[NetworkRule, ...] = ()
    #: a group of sandboxes on the node that reach each other (every port)
    #: whatever their mode, and that nothing else reaches; fixed at create
    group: str = ""

    @classmethod
    def parse(cls, s: str) -> "NetworkPolicy":
        """``"none"``, ``"open"`` or ``"allow:RULE[:PORT][/tcp|/udp],..."``
        with RULE a CIDR or a host name (as ``warren sandbox create
        --network``); the daemon validates."""
        if s in ("none", "open", "allowlist"):
            return cls(mode=s)
        if not s.startswith("allow:"):
            raise ValueError(f"network {s!r}: want none, open or allow:CIDR[:PORT][/PROTO],...")
        rules = []
        for item in s[len("allow:"):].split(","):
            if not item:
                continue
            proto = ""
            head, slash, tail = item.rpartition("/")
            if slash and tail and not tail[0].isdigit():
                item, proto = head, tail
            dest, colon, port = item.partition(":")
            # A CIDR or address has digits, dots and '/' only; a name has
            # a letter or a '*'.
            if any(c == "*" or c.isalpha() for c in dest):
                rules.append(NetworkRule(host=dest, port=int(port) if colon else None, protocol=proto))
            else:
                rules.append(NetworkRule(cidr=dest, port=int(port) if colon else None, protocol=proto))
        return cls(mode="allowlist", allow=tuple(rules))

    def __str__(self) -> str:
        if self.mode in ("", "none", "open"):
            return self.mode or "none"
        parts = []
        for r in self.allow:
            p = (r.host or r.cidr) + (f":{r.port}" if r.port is not None else "") + (f"/{r.protocol}" if r.protocol else "")
            parts.append(p)
        return "allow:" + ",".join(parts)

    @classmethod
    def _from_json(cls, d: Optional[Mapping[str, Any]]) -> "NetworkPolicy":
        if not d:
            return cls()
        return cls(
            mode=d.get("mode") or "none",
            allow=tuple(NetworkRule._from_json(r) for r in d.get("allow") or ()),
            group=d.get("group", ""),
        )

    def _to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"mode": self.mode}
        if self.allow:
            out["allow"] = [r._to_json() for r in self.allow]
        if self.group:
            out["group"] = self.group
        return out


#: What ``create(network=...)`` and ``update(network=...)`` take: a
#: :class:`NetworkPolicy` or its CLI spelling (``"open"``, ``"allow:10.0.0.0/8:443/tcp"``).
NetworkArg = Union[NetworkPolicy, str]


def _network_json(network: Optional[NetworkArg]) -> Optional[Dict[str, Any]]:
    if network is None:
        return None
    if isinstance(network, str):
        network = NetworkPolicy.parse(network)
    return network._to_json()


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the daemon describes it."""

    id: str
    image: str = ""
    backend: str = ""
    state: SandboxState = SandboxState.UNSPECIFIED
    resources: Resources = field(default_factory=Resources)
    env: Dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    created_at_unix_ms: int = 0
    expires_at_unix_ms: int = 0  #: 0 = never
    dead_reason: str = ""
    hostname: str = ""
    #: named layers stacked on the image, bottom first (as given to ``create``)
    layers: Tuple[str, ...] = ()
    #: default user of commands ("" = root)
    user: str = ""
    #: the image's own /etc/hosts, hostname and resolv.conf were kept
    keep_etc: bool = False
    #: setuid binaries work: created with ``allow_setuid=True``
    allow_setuid: bool = False
    #: it runs in a user namespace: root inside is host id ``user_id_base``
    user_namespace: bool = False
    user_id_base: int = 0
    #: the resource limits every process of the sandbox starts with: all of
    #: them, in the kernel's order (the defaults, or ``create(rlimits=...)``);
    #: empty for sandboxes of daemons before rlimits existed
    rlimits: Tuple[Rlimit, ...] = ()
    #: what the sandbox may reach (mode ``"none"`` when not given at create)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    #: its address on the node's sandbox subnet ("" in mode none)
    network_address: str = ""
    #: when it was paused (state PAUSED), else 0
    paused_at_unix_ms: int = 0
    #: how long it has been paused in all (process timeouts do not count it)
    paused_total_ms: int = 0
    #: when it was hibernated (state HIBERNATED), else 0
    hibernated_at_unix_ms: int = 0
    #: the checkpoint's size on disk while HIBERNATED
    checkpoint_bytes: int = 0
    #: the sandbox this one was forked from ("" when it was created)
    forked_from: str = ""
    #: it is a harness (``create(harness=True)``): how many children it may have
    max_children: int = 0
    #: the harness that created it ("" for one the node's API created)
    parent: str = ""
    #: the node that runs it, in a cluster (``warren gateway``); "" otherwise
    node: str = ""
    #: its CPU QoS class: ``"ls"`` (latency-sensitive) or ``"be"``
    #: (best-effort); "" from daemons before classes
    qos: str = ""
    #: the CPUs an ``"ls"`` sandbox is pinned to (empty: not pinned)
    qos_cpus: Tuple[int, ...] = ()
    #: the VNC server of its screen, a unix socket path on its node
    #: (backend ``"fullvm"``); "" without a display
    vnc: str = ""

    @property
    def harness(self) -> bool:
        """It is a harness: it drives its own sandboxes through its route."""
        return self.max_children > 0

    def rlimit(self, name: str) -> Optional[Rlimit]:
        """The sandbox's limit of ``name`` (``"nofile"``), or None."""
        for r in self.rlimits:
            if r.name == name:
                return r
        return None

    @property
    def created_at(self) -> Optional[_dt.datetime]:
        """Creation time (UTC)."""
        return _ms_to_datetime(self.created_at_unix_ms)

    @property
    def expires_at(self) -> Optional[_dt.datetime]:
        """When the daemon deletes the sandbox unless extended (UTC), or None."""
        return _ms_to_datetime(self.expires_at_unix_ms)

    @property
    def running(self) -> bool:
        return self.state == SandboxState.RUNNING

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=d.get("id", ""),
            image=d.get("image", ""),
            backend=d.get("backend", ""),
            state=SandboxState._parse(d.get("state")),
            resources=Resources._from_json(d.get("resources")),
            env=dict(d.get("env") or {}),
            workdir=d.get("workdir", ""),
            labels=dict(d.get("labels") or {}),
            created_at_unix_ms=_int(d.get("createdAtUnixMs")),
            expires_at_unix_ms=_int(d.get("expiresAtUnixMs")),
            dead_reason=d.get("deadReason", ""),
            hostname=d.get("hostname", ""),
            layers=tuple(d.get("layers") or ()),
            user=d.get("user", ""),
            keep_etc=bool(d.get("keepEtc", False)),
            allow_setuid=bool(d.get("allowSetuid", False)),
            user_namespace=bool(d.get("userNamespace", False)),
            user_id_base=_int(d.get("userIdBase")),
            rlimits=tuple(Rlimit._from_json(x) for x in d.get("rlimits") or ()),
            network=NetworkPolicy._from_json(d.get("network")),
            network_address=d.get("networkAddress", ""),
            paused_at_unix_ms=_int(d.get("pausedAtUnixMs")),
            paused_total_ms=_int(d.get("pausedTotalMs")),
            hibernated_at_unix_ms=_int(d.get("hibernatedAtUnixMs")),
            checkpoint_bytes=_int(d.get("checkpointBytes")),
            forked_from=d.get("forkedFrom", ""),
            max_children=_int((d.get("harness") or {}).get("maxChildren")),
            parent=d.get("parent", ""),
            node=d.get("node", ""),
            qos=d.get("qos", ""),
            qos_cpus=tuple(int(c) for c in d.get("qosCpus") or ()),
            vnc=d.get("vnc", ""),
        )


@dataclass(frozen=True)
class ExecResult:
    """The outcome of a command: its captured output and how it ended.

    Output beyond the exec's ``output_limit`` (per stream) is dropped by the
    daemon; ``stdout_truncated``/``stderr_truncated`` then say so and the
    ``*_dropped_bytes`` fields say how much was lost. The client warns about
    truncation by default (see ``AsyncWarren(on_truncation=...)``)."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int = 0  #: -1 when killed by a signal
    signal: int = 0  #: the signal that killed it, or 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0
    timed_out: bool = False  #: the exec's timeout passed and the process group was killed
    oom_killed: bool = False  #: killed by the out-of-memory killer
    duration_ms: int = 0
    pid: int = 0  #: process id inside the sandbox
    #: the step of the sandbox's trajectory log this exec was recorded as
    #: (0: not recorded), and whether this is that step's recorded result
    #: rather than a new run (see :func:`warren.rollout`)
    seq: int = 0
    replayed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and was neither killed nor timed out."""
        return self.exit_code == 0 and self.signal == 0 and not self.timed_out and not self.oom_killed

    @property
    def truncated(self) -> bool:
        """True when some output was dropped (either stream)."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def duration(self) -> float:
        """Run time in seconds."""
        return self.duration_ms / 1000.0

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stdout_text(self) -> str:
        return self.text

    @property
    def stderr_text(self) -> str:
        """stderr decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")

    def check(self, *, allow_truncation: bool = False) -> "ExecResult":
        """Return self if the command succeeded, else raise :class:`CommandError`.

        Failure means: a non-zero exit code, death by a signal, a timeout, an
        OOM kill, or (unless ``allow_truncation``) truncated output."""
        why = self._failure(allow_truncation)
        if why:
            raise CommandError(why, self)
        return self

    def _failure(self, allow_truncation: bool = False) -> str:
        if self.timed_out:
            return f"command timed out after {self.duration:.3f}s"
        if self.oom_killed:
            return "command was killed by the out-of-memory killer"
        if self.signal:
            return f"command was killed by signal {self.signal}"
        if self.exit_code != 0:
            tail = self.stderr[-400:].decode("utf-8", "replace").strip()
            return f"command exited with code {self.exit_code}" + (f": {tail}" if tail else "")
        if self.truncated and not allow_truncation:
            return (
                f"command output was truncated (stdout dropped {self.stdout_dropped_bytes} bytes, "
                f"stderr dropped {self.stderr_dropped_bytes} bytes)"
            )
        return ""

    @classmethod
    def _from_json(cls, d: Optional[Mapping[str, Any]]) -> "ExecResult":
        d = d or {}
        return cls(
            stdout=_b64(d.get("stdout")),
            stderr=_b64(d.get("stderr")),
            exit_code=_int(d.get("exitCode")),
            signal=_int(d.get("signal")),
            stdout_truncated=bool(d.get("stdoutTruncated", False)),
            stderr_truncated=bool(d.get("stderrTruncated", False)),
            stdout_dropped_bytes=_int(d.get("stdoutDroppedBytes")),
            stderr_dropped_bytes=_int(d.get("stderrDroppedBytes")),
            timed_out=bool(d.get("timedOut", False)),
            oom_killed=bool(d.get("oomKilled", False)),
            duration_ms=_int(d.get("durationMs")),
            pid=_int(d.get("pid")),
            seq=_int(d.get("seq")),
            replayed=bool(d.get("replayed", False)),
        )

    def _with_output(self, stdout: bytes, stderr: bytes) -> "ExecResult":
        from dataclasses import replace

        return replace(self, stdout=stdout, stderr=stderr)


@dataclass(frozen=True)
class ExecEvent:
    """One event of a streaming exec: a chunk of stdout, a chunk of stderr,
    or (last) the result, whose stdout and stderr hold everything that was
    streamed (within the output limit)."""

    stdout: bytes = b""
    stderr: bytes = b""
    result: Optional[ExecResult] = None

    @property
    def kind(self) -> str:
        """``"stdout"``, ``"stderr"`` or ``"result"``."""
        if self.result is not None:
            return "result"
        return "stderr" if self.stderr else "stdout"

    @property
    def data(self) -> bytes:
        """The chunk's bytes (empty for the result event)."""
        return self.stdout or self.stderr


@dataclass(frozen=True)
class ProcessInfo:
    """A background process of a sandbox."""

    sandbox_id: str
    process_id: str  #: stable handle such as ``"p-1"``
    pid: int = 0
    argv: Tuple[str, ...] = ()
    running: bool = False
    started_at_unix_ms: int = 0
    #: set once it exited; its stdout and stderr are empty (see wait, attach)
    result: Optional[ExecResult] = None
    pty: bool = False  #: runs on a terminal
    stdout_bytes: int = 0  #: written so far: attach from here follows what comes next
    stderr_bytes: int = 0

    @property
    def started_at(self) -> Optional[_dt.datetime]:
        return _ms_to_datetime(self.started_at_unix_ms)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        res = d.get("result")
        return cls(
            sandbox_id=d.get("sandboxId", ""),
            process_id=d.get("processId", ""),
            pid=_int(d.get("pid")),
            argv=tuple(d.get("argv") or ()),
            running=bool(d.get("running", False)),
            started_at_unix_ms=_int(d.get("startedAtUnixMs")),
            result=ExecResult._from_json(res) if res is not None else None,
            pty=bool(d.get("pty", False)),
            stdout_bytes=_int(d.get("stdoutBytes")),
            stderr_bytes=_int(d.get("stderrBytes")),
        )


@dataclass(frozen=True)
class SecurityEvent:
    """An action the node contained or denied in a sandbox (see
    :meth:`AsyncSandbox.events`)."""

    seq: int  #: per sandbox, from 1; a gap is events the node let go
    kind: str  #: ``oom_kill``, ``pids_limit``, ``output_cap``, ``disk_full``, ``inodes_full``, ``timeout``, ``disk_reserve``, ... (accept unknown kinds)
    detail: str = ""
    count: int = 1  #: occurrences it stands for (a kernel counter's rise)
    process: str = ""  #: ``"pid N"`` of an exec, or a background process id
    time_unix_ms: int = 0
    suppressed: int = 0  #: events the rate limit left out just before this one

    @property
    def time(self) -> Optional[_dt.datetime]:
        return _ms_to_datetime(self.time_unix_ms)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "SecurityEvent":
        return cls(
            seq=_int(d.get("seq")),
            kind=d.get("kind", ""),
            detail=d.get("detail", ""),
            count=_int(d.get("count")),
            process=d.get("process", ""),
            time_unix_ms=_int(d.get("timeUnixMs")),
            suppressed=_int(d.get("suppressed")),
        )


@dataclass(frozen=True)
class ProcessEvent:
    """One event of :meth:`AsyncProcess.attach`: a chunk of stdout or stderr
    at its absolute ``offset`` in the stream (a jump past the previous
    chunk's end means bytes no longer kept were skipped), or (last) the
    exit, an :class:`ExecResult` without output."""

    stream: str  #: ``"stdout"``, ``"stderr"`` or ``"exit"``
    data: bytes = b""
    offset: int = 0
    result: Optional[ExecResult] = None


@dataclass(frozen=True)
class FileEvent:
    """One change below a directory :meth:`AsyncSandbox.watch_dir` follows."""

    path: str  #: relative to the watched directory
    type: str  #: ``"create"``, ``"write"``, ``"remove"``, ``"rename"`` or ``"chmod"``
    is_dir: bool = False

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "FileEvent":
        t = str(d.get("type") or "")
        return cls(
            path=d.get("path", ""),
            type=t.removeprefix("FILE_EVENT_TYPE_").lower(),
            is_dir=bool(d.get("isDir", False)),
        )


@dataclass(frozen=True)
class SandboxStats:
    """A running sandbox's resource use when it was read
    (:meth:`AsyncSandbox.stats`); read twice for a CPU rate."""

    sampled_at_unix_ms: int = 0
    cpu_usage_ns: int = 0  #: cumulative CPU time of its processes
    cpu_count: int = 0  #: CPUs it may use (its quota rounded up, or the node's)
    memory_bytes: int = 0  #: charged to it, page cache included
    memory_cache_bytes: int = 0
    memory_limit_bytes: int = 0
    disk_bytes: int = 0  #: size of its writable layer's filesystem
    disk_used_bytes: int = 0
    pids: int = 0
    oom_kills: int = 0
    #: of memory_bytes: anonymous (heaps, stacks, tmpfs) and kernel memory
    memory_anon_bytes: int = 0
    memory_kernel_bytes: int = 0
    memory_swap_bytes: int = 0  #: out on swap, beside memory_bytes

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "SandboxStats":
        return cls(
            sampled_at_unix_ms=_int(d.get("sampledAtUnixMs")),
            cpu_usage_ns=_int(d.get("cpuUsageNs")),
            cpu_count=_int(d.get("cpuCount")),
            memory_bytes=_int(d.get("memoryBytes")),
            memory_cache_bytes=_int(d.get("memoryCacheBytes")),
            memory_limit_bytes=_int(d.get("memoryLimitBytes")),
            disk_bytes=_int(d.get("diskBytes")),
            disk_used_bytes=_int(d.get("diskUsedBytes")),
            pids=_int(d.get("pids")),
            oom_kills=_int(d.get("oomKills")),
            memory_anon_bytes=_int(d.get("memoryAnonBytes")),
            memory_kernel_bytes=_int(d.get("memoryKernelBytes")),
            memory_swap_bytes=_int(d.get("memorySwapBytes")),
        )


@dataclass(frozen=True)
class DownloadStats:
    """What :meth:`AsyncSandbox.download` wrote into the local directory."""

    entries: int = 0  #: archive entries read (all kinds)
    files: int = 0  #: regular files written
    dirs: int = 0  #: directory entries
    symlinks: int = 0  #: symlinks made (as links, never followed)
    hardlinks: int = 0  #: hard links to files of the same download
    skipped: int = 0  #: devices, FIFOs, sockets and unknown types, never made
    file_bytes: int = 0  #: regular-file content, apparent size (holes included)
    modes_masked: int = 0  #: entries whose permission bits lost bits to the 0o755 mask
    special_bits: int = 0  #: ... of them with setuid, setgid or sticky
    xattrs_dropped: int = 0  #: extended attributes and ACLs not applied (see ``xattr_allow``)


@dataclass(frozen=True)
class FileInfo:
    """A file in a sandbox (symlinks are not followed)."""

    name: str
    path: str
    size: int = 0
    mode: int = 0  #: permission bits, e.g. 0o644
    is_dir: bool = False
    is_symlink: bool = False
    link_target: str = ""
    mtime_unix_ms: int = 0
    type: str = ""  #: "file", "dir", "symlink" or "other"

    @property
    def mtime(self) -> Optional[_dt.datetime]:
        return _ms_to_datetime(self.mtime_unix_ms)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "FileInfo":
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            size=_int(d.get("size")),
            mode=_int(d.get("mode")),
            is_dir=bool(d.get("isDir", False)),
            is_symlink=bool(d.get("isSymlink", False)),
            link_target=d.get("linkTarget", ""),
            mtime_unix_ms=_int(d.get("mtimeUnixMs")),
            type=d.get("type", ""),
        )


@dataclass(frozen=True)
class Image:
    """An image of the daemon's store.

    The OCI config fields (``env``, ``entrypoint``, ``cmd``, ``working_dir``,
    ``user``, ``platform``) are set for images pulled with
    :meth:`AsyncWarren.pull_image` and empty for root filesystem imports.
    A sandbox of the image starts with its ``env`` (``create(env=...)``
    wins over it) and, by default, in its ``working_dir``."""

    name: str
    id: str = ""  #: digest of the layer list
    layers: Tuple[str, ...] = ()  #: layer digests, bottom-most first
    size_bytes: int = 0
    created_at_unix_ms: int = 0
    #: uncompressed tar digests of the layers, in ``layers`` order (empty
    #: for legacy directory layers)
    diff_ids: Tuple[str, ...] = ()
    #: pulled images: the reference with the manifest digest
    source: str = ""
    env: Tuple[str, ...] = ()  #: ``"KEY=value"`` entries of the OCI config
    entrypoint: Tuple[str, ...] = ()
    cmd: Tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    platform: str = ""  #: ``os/arch[/variant]``

    @property
    def created_at(self) -> Optional[_dt.datetime]:
        return _ms_to_datetime(self.created_at_unix_ms)

    @property
    def env_dict(self) -> Dict[str, str]:
        """``env`` as a mapping (later entries win)."""
        out: Dict[str, str] = {}
        for kv in self.env:
            k, _, v = kv.partition("=")
            out[k] = v
        return out

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "Image":
        return cls(
            name=d.get("name", ""),
            id=d.get("id", ""),
            layers=tuple(d.get("layers") or ()),
            size_bytes=_int(d.get("sizeBytes")),
            created_at_unix_ms=_int(d.get("createdAtUnixMs")),
            diff_ids=tuple(d.get("diffIds") or ()),
            source=d.get("source", ""),
            env=tuple(d.get("env") or ()),
            entrypoint=tuple(d.get("entrypoint") or ()),
            cmd=tuple(d.get("cmd") or ()),
            working_dir=d.get("workingDir", ""),
            user=d.get("user", ""),
            platform=d.get("platform", ""),
        )


@dataclass(frozen=True)
class Layer:
    """A named layer: one read-only layer that sandboxes stack on top of
    their image (``create(..., layers=[...])``). Named layers have their own
    namespace, apart from image names."""

    name: str
    digest: str = ""  #: digest of the layer's EROFS blob
    diff_id: str = ""  #: digest of the tar stream it was built from
    size_bytes: int = 0  #: regular file content
    blob_size_bytes: int = 0
    files: int = 0
    created_at_unix_ms: int = 0
    #: committed layers: setuid/setgid bits and file capabilities were kept
    #: (``commit(..., keep_setuid=True)``); otherwise they were stripped
    setuid_kept: bool = False
    #: committed layers: how many files lost setuid/setgid bits or capabilities
    setuid_stripped: int = 0

    @property
    def created_at(self) -> Optional[_dt.datetime]:
        return _ms_to_datetime(self.created_at_unix_ms)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "Layer":
        return cls(
            name=d.get("name", ""),
            digest=d.get("digest", ""),
            diff_id=d.get("diffId", ""),
            size_bytes=_int(d.get("sizeBytes")),
            blob_size_bytes=_int(d.get("blobSizeBytes")),
            files=_int(d.get("files")),
            created_at_unix_ms=_int(d.get("createdAtUnixMs")),
            setuid_kept=bool(d.get("setuidKept", False)),
            setuid_stripped=_int(d.get("setuidStripped")),
        )


@dataclass(frozen=True)
class PullEvent:
    """A progress event of :meth:`AsyncWarren.pull_image`.

    ``phase`` is ``"resolve"`` (finding the image), ``"layer"`` (a layer's
    status changed or it progressed), ``"record"`` (writing the image record)
    or ``"done"`` (the last event, with ``image``). Layer events carry the
    layer's index (bottom first), the layer count and a ``status``:
    ``"waiting"``, ``"downloading"`` (``current``/``total``: compressed
    bytes), ``"converting"`` (``current``: EROFS bytes written, ``total``: an
    estimate), ``"exists"`` (already stored, not downloaded again) or
    ``"done"``."""

    phase: str = ""
    layer: int = 0  #: index, bottom first
    layers: int = 0  #: how many
    digest: str = ""  #: compressed layer digest (empty for docker-archive)
    status: str = ""
    current: int = 0
    total: int = 0  #: 0 when unknown
    message: str = ""
    image: Optional[Image] = None  #: set on the last event

    @property
    def done(self) -> bool:
        """True for the last event (it carries the image)."""
        return self.image is not None

    @property
    def fraction(self) -> Optional[float]:
        """``current / total`` (capped at 1), or None when the total is unknown."""
        if self.total <= 0:
            return None
        return min(1.0, self.current / self.total)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "PullEvent":
        img = d.get("image")
        return cls(
            phase=d.get("phase", ""),
            layer=_int(d.get("layer")),
            layers=_int(d.get("layers")),
            digest=d.get("digest", ""),
            status=d.get("status", ""),
            current=_int(d.get("current")),
            total=_int(d.get("total")),
            message=d.get("message", ""),
            image=Image._from_json(img) if img is not None else None,
        )


@dataclass(frozen=True)
class LayerStat:
    """The state of one layer on the daemon's node (:meth:`AsyncWarren.image_stats`)."""

    digest: str = ""
    diff_id: str = ""
    format: str = ""  #: ``"erofs"``, or ``"dir"`` for a legacy directory layer
    size: int = 0  #: blob bytes (erofs) or content bytes (dir)
    #: blob bytes whose content is in the node's page cache (erofs), each
    #: block once: with on-demand loading, what sandboxes have read of it
    resident: int = 0
    files: int = 0
    mounted: bool = False  #: mounted in the node's layer cache
    refs: int = 0  #: sandboxes of the node using the mount
    owner: str = ""  #: the image name, or ``"layer:NAME"`` for a named layer
    blob_resident: int = 0  #: of the blob file's own page cache (metadata; all reads without direct I/O)
    files_resident: int = 0  #: page cache of the mounted layer's files and directories
    direct_io: bool = False  #: the mount reads the blob with direct I/O
    read_ahead_kb: int = 0  #: readahead window of the mount (0: unknown)

    @property
    def resident_fraction(self) -> float:
        """``resident / size`` (0 for an empty layer)."""
        return self.resident / self.size if self.size > 0 else 0.0

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "LayerStat":
        return cls(
            digest=d.get("digest", ""),
            diff_id=d.get("diffId", ""),
            format=d.get("format", ""),
            size=_int(d.get("size")),
            resident=_int(d.get("resident")),
            files=_int(d.get("files")),
            mounted=bool(d.get("mounted", False)),
            refs=_int(d.get("refs")),
            owner=d.get("owner", ""),
            blob_resident=_int(d.get("blobResident")),
            files_resident=_int(d.get("filesResident")),
            direct_io=bool(d.get("directIo", False)),
            read_ahead_kb=_int(d.get("readAheadKb")),
        )


@dataclass(frozen=True)
class LayerVerification:
    """The result of hashing one stored blob (:meth:`AsyncWarren.verify_image`)."""

    digest: str = ""
    #: the image name or ``"layer:NAME"`` ("" when every blob was verified)
    owner: str = ""
    ok: bool = False
    error: str = ""  #: why not

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "LayerVerification":
        return cls(
            digest=d.get("digest", ""),
            owner=d.get("owner", ""),
            ok=bool(d.get("ok", False)),
            error=d.get("error", ""),
        )


@dataclass(frozen=True)
class NodeGPU:
    """One of the node's GPUs that ``run(gpus=...)`` hands out."""

    index: int = 0  #: N of /dev/nvidia<N>
    device: str = ""  #: the device node on the node
    exclusive: bool = False  #: an exclusive job holds it now
    shared_jobs: int = 0  #: shared jobs on it now

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "NodeGPU":
        return cls(
            index=int(d.get("index", 0)),
            device=d.get("device", ""),
            exclusive=bool(d.get("exclusive", False)),
            shared_jobs=int(d.get("sharedJobs", 0)),
        )


@dataclass(frozen=True)
class VersionInfo:
    """The daemon's version and capabilities."""

    version: str = ""
    commit: str = ""
    backends: Tuple[str, ...] = ()
    cgroup_mode: str = ""  #: "v1", "v2" or "hybrid"
    gpus: Tuple[NodeGPU, ...] = ()  #: the node's GPUs for fncall jobs

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "VersionInfo":
        return cls(
            version=d.get("version", ""),
            commit=d.get("commit", ""),
            backends=tuple(d.get("backends") or ()),
            cgroup_mode=d.get("cgroupMode", ""),
            gpus=tuple(NodeGPU._from_json(g) for g in d.get("gpus") or ()),
        )


@dataclass(frozen=True)
class NodeStatus:
    """One node as :meth:`AsyncWarren.nodes` reports it: what a gateway
    places sandboxes by (docs/ARCHITECTURE.md, "The cluster")."""

    name: str = ""
    tag: str = ""  #: the prefix of its sandboxes' ids
    address: str = ""  #: its API address as the gateway reaches it ("" from a node)
    up: bool = False  #: as the gateway sees it (a node reports itself up)
    cpu_millis: int = 0  #: capacity
    memory_bytes: int = 0
    max_sandboxes: int = 0  #: 0: no cap
    alloc_cpu_millis: int = 0  #: what its live sandboxes asked for
    alloc_memory_bytes: int = 0
    sandboxes: int = 0  #: live (not stopped) sandboxes
    load: float = 0.0  #: 1-minute load average per CPU
    layers: Tuple[str, ...] = ()  #: digests of the layers mounted now
    qos: Dict[str, int] = field(default_factory=dict)  #: live sandboxes per QoS class
    label_counts: Dict[str, int] = field(default_factory=dict)  #: live sandboxes per "key=value"

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "NodeStatus":
        return cls(
            name=d.get("name", ""),
            tag=d.get("tag", ""),
            address=d.get("address", ""),
            up=bool(d.get("up", False)),
            cpu_millis=_int(d.get("cpuMillis")),
            memory_bytes=_int(d.get("memoryBytes")),
            max_sandboxes=_int(d.get("maxSandboxes")),
            alloc_cpu_millis=_int(d.get("allocCpuMillis")),
            alloc_memory_bytes=_int(d.get("allocMemoryBytes")),
            sandboxes=_int(d.get("sandboxes")),
            load=float(d.get("load") or 0.0),
            layers=tuple(d.get("layers") or ()),
            qos={k: _int(v) for k, v in (d.get("qos") or {}).items()},
            label_counts={k: _int(v) for k, v in (d.get("labelCounts") or {}).items()},
        )


def _list(d: Mapping[str, Any], key: str) -> List[Any]:
    v = d.get(key)
    return list(v) if v else []


@dataclass(frozen=True)
class Memory:
    """A sandbox's memory in bytes."""

    bytes: int = 0  #: everything charged to it
    file: int = 0  #: page cache
    anon: int = 0  #: anonymous memory
    swap: int = 0  #: out on swap or zswap

    @classmethod
    def _from_json(cls, d: Optional[Mapping[str, Any]]) -> "Memory":
        d = d or {}
        return cls(bytes=_int(d.get("bytes")), file=_int(d.get("file")), anon=_int(d.get("anon")), swap=_int(d.get("swap")))


@dataclass(frozen=True)
class Screenshot:
    """A sandbox's screen (backend ``"fullvm"``): a PNG and its size."""

    png: bytes
    width: int = 0
    height: int = 0

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "Screenshot":
        return cls(
            png=base64.b64decode(d.get("png") or ""), width=_int(d.get("width")), height=_int(d.get("height"))
        )


@dataclass(frozen=True)
class InputEvent:
    """One keyboard or pointer event for :meth:`AsyncWarren.send_input`.

    ``kind`` is ``"key"`` (``key``: QEMU's QKeyCode name, ``"a"``,
    ``"ret"``, ``"shift"``, ``"f1"``...), ``"button"`` (``button``:
    ``"left"``, ``"right"``, ``"middle"``, ``"wheel-up"``,
    ``"wheel-down"``) or ``"move"`` (``x``, ``y``: pixels from the
    screen's top left). ``action`` for keys and buttons: ``"press"`` (down
    then up, the default), ``"down"`` or ``"up"``."""

    kind: str
    key: str = ""
    button: str = ""
    action: str = ""
    x: int = 0
    y: int = 0

    def _to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in (("kind", self.kind), ("key", self.key), ("button", self.button),
                                  ("action", self.action), ("x", self.x), ("y", self.y)) if v}


@dataclass(frozen=True)
class PauseResult:
    """What a pause did: the sandbox (now PAUSED), its memory once frozen
    (``before``) and once reclaimed (``after``, equal without reclaim), and
    the timings in microseconds."""

    sandbox: SandboxInfo
    before: Memory = field(default_factory=Memory)
    after: Memory = field(default_factory=Memory)
    freeze_us: int = 0
    reclaim_us: int = 0
    total_us: int = 0

    @property
    def freed_bytes(self) -> int:
        """Memory the pause gave back."""
        return max(0, self.before.bytes - self.after.bytes)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "PauseResult":
        return cls(
            sandbox=SandboxInfo._from_json(d.get("sandbox") or {}),
            before=Memory._from_json(d.get("before")),
            after=Memory._from_json(d.get("after")),
            freeze_us=_int(d.get("freezeUs")),
            reclaim_us=_int(d.get("reclaimUs")),
            total_us=_int(d.get("totalUs")),
        )


@dataclass(frozen=True)
class ResumeResult:
    """What a resume did: the sandbox (now RUNNING), the thaw's time and how
    long it had been paused."""

    sandbox: SandboxInfo
    thaw_us: int = 0
    paused_ms: int = 0
    #: The sandbox was HIBERNATED and was restored from its checkpoint;
    #: ``restore_us`` is how long that took (``thaw_us`` is 0).
    restored: bool = False
    restore_us: int = 0
    #: A restore: its memory comes back lazily, as its processes touch it.
    lazy_pages: bool = False
    #: A restore that was to be lazy and was not: why (the node's kernel or
    #: its ``vm.unprivileged_userfaultfd``, the backend).
    eager_reason: str = ""

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "ResumeResult":
        return cls(
            sandbox=SandboxInfo._from_json(d.get("sandbox") or {}),
            thaw_us=_int(d.get("thawUs")),
            paused_ms=_int(d.get("pausedMs")),
            restored=bool(d.get("restored", False)),
            restore_us=_int(d.get("restoreUs")),
            lazy_pages=bool(d.get("lazyPages", False)),
            eager_reason=str(d.get("eagerReason") or ""),
        )


@dataclass(frozen=True)
class HibernateResult:
    """What a hibernation did: the sandbox (now HIBERNATED), the memory it
    held and gave back (``before``), the checkpoint's size on disk
    (``bytes``), CRIU's checkpoint time and the whole call's, in
    microseconds."""

    sandbox: SandboxInfo
    checkpoint_us: int = 0
    total_us: int = 0
    bytes: int = 0
    before: Memory = field(default_factory=Memory)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "HibernateResult":
        return cls(
            sandbox=SandboxInfo._from_json(d.get("sandbox") or {}),
            checkpoint_us=_int(d.get("checkpointUs")),
            total_us=_int(d.get("totalUs")),
            bytes=_int(d.get("bytes")),
            before=Memory._from_json(d.get("before")),
        )


@dataclass(frozen=True)
class ByLabelEvent:
    """One sandbox's outcome in a by-label pause or resume, as it finished:
    ``error`` (with its category ``error_code``) when it failed, else
    ``paused`` or ``resumed``; ``completed`` of ``total`` are done."""

    sandbox_id: str
    error: str = ""
    error_code: str = ""
    paused: Optional[PauseResult] = None
    resumed: Optional[ResumeResult] = None
    hibernated: Optional[HibernateResult] = None
    completed: int = 0
    total: int = 0

    @property
    def ok(self) -> bool:
        return not self.error

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "ByLabelEvent":
        return cls(
            sandbox_id=d.get("sandboxId", ""),
            error=d.get("error", ""),
            error_code=d.get("errorCode", ""),
            paused=PauseResult._from_json(d["paused"]) if d.get("paused") else None,
            resumed=ResumeResult._from_json(d["resumed"]) if d.get("resumed") else None,
            hibernated=HibernateResult._from_json(d["hibernated"]) if d.get("hibernated") else None,
            completed=_int(d.get("completed")),
            total=_int(d.get("total")),
        )


@dataclass(frozen=True)
class ByLabelResult:
    """Every sandbox's event of a by-label call, in the order they
    finished, and the totals."""

    events: Tuple[ByLabelEvent, ...] = ()
    total: int = 0
    failed: int = 0

    @property
    def ok(self) -> bool:
        return self.failed == 0


# -- fncall: Run and RunBatch ---------------------------------------------


@dataclass(frozen=True)
class Step:
    """One program of a :meth:`AsyncWarren.run` job. ``command`` is an argv
    list, or a string run with ``sh -c``. Limits of 0 take the node's
    defaults (CPU 10 s, wall 2 x CPU + 1 s, memory 256 MiB, 64 processes,
    64 KiB per output stream, 64 MiB per file written, 256 open files,
    64 KiB per output file read back). ``files`` are written into the work
    directory ``/w`` first: bytes, or ``(step_index, output_name)`` for an
    output file of an earlier step of the same job."""

    command: Any
    env: Optional[Mapping[str, str]] = None
    stdin: bytes = b""
    files: Optional[Mapping[str, Any]] = None
    outputs: Sequence[str] = ()
    cpu: float = 0.0  #: seconds of CPU time
    wall: float = 0.0  #: seconds
    memory: int = 0  #: bytes of peak resident memory
    processes: int = 0
    output_bytes: int = 0
    file_size: int = 0
    open_files: int = 0
    file_out_bytes: int = 0
    #: bytes the whole job may write (its largest step's); 0: the node's default
    disk_bytes: int = 0
    continue_on_failure: bool = False

    def _to_json(self) -> Dict[str, Any]:
        argv = ["sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)
        if not argv:
            raise ValueError("empty command")
        d: Dict[str, Any] = {"argv": argv}
        if self.env:
            d["env"] = dict(self.env)
        if self.stdin:
            d["stdin"] = base64.b64encode(bytes(self.stdin)).decode("ascii")
        if self.files:
            fs = []
            for name, v in self.files.items():
                if isinstance(v, tuple):
                    fs.append({"name": name, "fromStep": int(v[0]), "from": str(v[1])})
                else:
                    if isinstance(v, str):
                        v = v.encode("utf-8")
                    fs.append({"name": name, "data": base64.b64encode(bytes(v)).decode("ascii")})
            d["files"] = fs
        if self.outputs:
            d["outputs"] = list(self.outputs)
        lim = {
            "cpuMs": str(int(self.cpu * 1000)) if self.cpu else None,
            "wallMs": str(int(self.wall * 1000)) if self.wall else None,
            "memoryBytes": str(self.memory) if self.memory else None,
            "processes": self.processes or None,
            "outputBytes": str(self.output_bytes) if self.output_bytes else None,
            "fileSizeBytes": str(self.file_size) if self.file_size else None,
            "openFiles": self.open_files or None,
            "fileOutBytes": str(self.file_out_bytes) if self.file_out_bytes else None,
            "diskBytes": str(self.disk_bytes) if self.disk_bytes else None,
        }
        lim = {k: v for k, v in lim.items() if v is not None}
        if lim:
            d["limits"] = lim
        if self.continue_on_failure:
            d["continueOnFailure"] = True
        return d


@dataclass(frozen=True)
class RunFileResult:
    """An output file of a step: its data, or why it could not be read."""

    name: str
    data: bytes = b""
    error: str = ""


@dataclass(frozen=True)
class JobStepResult:
    """How one step of a job ended. ``status`` is ``accepted``,
    ``non_zero_exit``, ``signalled``, ``time_limit``, ``memory_limit``,
    ``output_limit``, ``file_error`` or ``internal_error``: a program's
    failure is a status, never an exception."""

    status: str
    exit_code: int = 0
    signal: int = 0
    cpu_us: int = 0
    wall_us: int = 0
    peak_memory_bytes: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str = ""
    files: Tuple[RunFileResult, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "accepted"

    def file(self, name: str) -> RunFileResult:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(name)

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "JobStepResult":
        st = str(d.get("status", "RUN_STATUS_UNSPECIFIED"))
        return cls(
            status=st.replace("RUN_STATUS_", "").lower(),
            exit_code=_int(d.get("exitCode")),
            signal=_int(d.get("signal")),
            cpu_us=_int(d.get("cpuUs")),
            wall_us=_int(d.get("wallUs")),
            peak_memory_bytes=_int(d.get("peakMemoryBytes")),
            stdout=_b64(d.get("stdout")),
            stderr=_b64(d.get("stderr")),
            stdout_truncated=bool(d.get("stdoutTruncated")),
            stderr_truncated=bool(d.get("stderrTruncated")),
            error=d.get("error", ""),
            files=tuple(
                RunFileResult(name=f.get("name", ""), data=_b64(f.get("data")), error=f.get("error", ""))
                for f in d.get("files") or []
            ),
        )


@dataclass(frozen=True)
class RunResult:
    """The steps a job ran, in order (a failed step without
    ``continue_on_failure`` is the last)."""

    steps: Tuple[JobStepResult, ...]
    wall_us: int = 0

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    @property
    def last(self) -> JobStepResult:
        return self.steps[-1]

    @classmethod
    def _from_json(cls, d: Mapping[str, Any]) -> "RunResult":
        return cls(steps=tuple(JobStepResult._from_json(s) for s in d.get("steps") or []), wall_us=_int(d.get("wallUs")))
