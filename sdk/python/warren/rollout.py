"""Rollout sessions: resume an agent loop by re-running its code.

Every exec and file write on a sandbox is recorded in the sandbox's
trajectory log as a numbered step. Inside ``rollout(sandbox, session_id)``
the calls made through ``sandbox`` are numbered 1, 2, 3... in the order
the code makes them, and carry the session id. When the code runs again
(the trainer was preempted and restarted, the daemon restarted), the
calls the log already has return their recorded results at once without
running anything, and the first call past the end of the log runs live::

    async with warren.rollout(sb, "episode-17") as r:
        for action in agent.actions():     # the same code on every run
            res = await sb.exec(action)
    print(r.replayed, r.live)

A call whose request differs from the recorded one (the agent diverged)
raises :class:`warren.ConflictError` naming the step and what differs:
nothing is guessed.

Entering the session reads the session's recorded steps once; an exec or
file call whose request equals its step's recorded request (field by
field, payloads by SHA-256) is answered from them without a round trip,
so a replay costs microseconds. Anything else goes to the daemon, which
decides: replays, refuses a mismatch, or runs the call live. Calls through other handles of the same sandbox are
not numbered by the session (they are recorded as their own steps).
Uploads (``upload``, ``upload_tar``, large ``write_file``) are numbered
steps too, always sent to the daemon, and not in the counts. Background
processes (``start``) are not recorded. The synchronous
:class:`warren.Sandbox` works the same way, with ``with``.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Dict, Mapping, Optional, Union

from ._async import AsyncSandbox
from ._types import ExecResult
from .errors import error_from_status

__all__ = ["Rollout", "rollout"]


class Rollout:
    """A rollout session on one sandbox handle (see the module doc).

    ``seq`` is the last step number given out; ``replayed`` and ``live``
    count the exec and file calls that succeeded, answered from the log
    and run (failed calls take a step but are not counted)."""

    def __init__(self, sandbox: Any, session_id: str, *, start: int = 0, read_ahead: bool = True) -> None:
        if not session_id:
            raise ValueError("a rollout needs a session id")
        self._aio: AsyncSandbox = getattr(sandbox, "aio", sandbox)
        if not isinstance(self._aio, AsyncSandbox):
            raise TypeError(f"rollout needs a Sandbox or AsyncSandbox, not {type(sandbox).__name__}")
        self.session_id = session_id
        self.seq = int(start)
        self.replayed = 0
        self.live = 0
        # The sync client runs calls on its loop thread.
        self._lock = threading.Lock()
        self._sync = sandbox if hasattr(sandbox, "_run") else None
        self._read_ahead = read_ahead
        self._recorded: Dict[int, Mapping[str, Any]] = {}

    async def _prefetch(self) -> None:
        self._recorded = {}
        if not self._read_ahead:
            return
        for e in await self._aio.trajectory(self.session_id):
            seq = int(e.get("seq") or 0)
            # Later entries of a seq supersede earlier ones; steps refused
            # before they ran, or interrupted, are the daemon's to decide.
            if e.get("notRun") or e.get("interrupted"):
                self._recorded.pop(seq, None)
            else:
                self._recorded[seq] = e

    def _match(self, seq: int, method: str, body: Mapping[str, Any], payload: bytes) -> Optional[Mapping[str, Any]]:
        e = self._recorded.get(seq)
        if e is None or e.get("method") != method:
            return None
        key = _REQUEST_KEY[method]
        if _canon(_request_part(e.get(key) or {}, method)) != _canon(_request_part(body, method)):
            return None
        if (e.get("payloadSha256") or "") != (hashlib.sha256(payload).hexdigest() if payload else ""):
            return None
        return e

    def _exec_result(self, e: Mapping[str, Any]) -> ExecResult:
        _raise_recorded(e)
        self._count(True)
        d = dict(e.get("execResult") or {})
        d["seq"], d["replayed"] = e.get("seq"), True
        return ExecResult._from_json(d)

    def _outcome(self, e: Mapping[str, Any]) -> None:
        _raise_recorded(e)
        self._count(True)

    def _next(self) -> int:
        with self._lock:
            self.seq += 1
            return self.seq

    def _count(self, replayed: bool) -> None:
        with self._lock:
            if replayed:
                self.replayed += 1
            else:
                self.live += 1

    def _attach(self) -> "Rollout":
        if self._aio._rollout is not None:
            raise RuntimeError(f"sandbox {self._aio.id} is already in rollout session {self._aio._rollout.session_id!r}")
        self._aio._rollout = self
        return self

    def _detach(self) -> None:
        if self._aio._rollout is self:
            self._aio._rollout = None

    async def __aenter__(self) -> "Rollout":
        await self._prefetch()
        return self._attach()

    async def __aexit__(self, *exc: Any) -> None:
        self._detach()

    def __enter__(self) -> "Rollout":
        if self._sync is not None:
            self._sync._run(self._prefetch())
        return self._attach()

    def __exit__(self, *exc: Any) -> None:
        self._detach()

    def __repr__(self) -> str:
        return f"<Rollout {self.session_id!r} on {self._aio.id} seq={self.seq} replayed={self.replayed} live={self.live}>"


def rollout(sandbox: Union[AsyncSandbox, Any], session_id: str, *, start: int = 0, read_ahead: bool = True) -> Rollout:
    """A rollout session numbering the calls made through ``sandbox``
    (an :class:`AsyncSandbox` or a :class:`Sandbox`): use it with
    ``async with`` or ``with``. ``start`` is the step before the first
    (0: the session's calls are steps 1, 2, ...). ``read_ahead=False``
    does not read the session's steps at the start: every call then goes
    to the daemon (one round trip per replayed step, no log in memory)."""
    return Rollout(sandbox, session_id, start=start, read_ahead=read_ahead)


# The fields that address a call rather than say what it does (left out of
# the daemon's canonical hash too), and each method's payload field.
_UNHASHED = frozenset({"sandboxId", "sessionId", "seq", "idempotencyKey"})
_PAYLOAD = {"exec": "stdin", "write_file": "content"}
_REQUEST_KEY = {"exec": "exec", "write_file": "writeFile", "make_dir": "makeDir", "remove_file": "removeFile"}


def _request_part(d: Mapping[str, Any], method: str) -> Dict[str, Any]:
    payload = _PAYLOAD.get(method)
    return {k: v for k, v in d.items() if k not in _UNHASHED and k != payload}


def _canon(v: Any) -> Any:
    """A request in the JSON form's proto3 meaning: fields at their
    default are absent, and numbers compare as text (int64s are strings
    in JSON)."""
    t = type(v)
    if t is dict:
        return {k: _canon(x) for k, x in v.items() if not _is_default(x)}
    if t is list or t is tuple:
        return [_canon(x) for x in v]
    if t is bool or t is str:
        return v
    return str(v)


def _is_default(x: Any) -> bool:
    # JSON from the daemon and the SDK's own bodies hold only these types.
    t = type(x)
    if x is None or t is bool:
        return x is not True
    if t is int or t is float:
        return bool(x == 0)
    return not x


# The Connect code of each category, for recorded errors.
_CATEGORY_CODES = {
    "not_found": "not_found", "invalid": "invalid_argument", "exhausted": "resource_exhausted",
    "conflict": "failed_precondition", "unavailable": "unavailable", "deadline_exceeded": "deadline_exceeded",
    "unauthenticated": "unauthenticated", "permission_denied": "permission_denied", "internal": "internal",
    "unsupported": "unimplemented",
}


def _raise_recorded(e: Mapping[str, Any]) -> None:
    cat = e.get("errorCategory") or ""
    if not cat and not e.get("error"):
        return
    if cat == "already_exists":
        raise error_from_status("already_exists", str(e.get("error") or ""), category="conflict")
    raise error_from_status(_CATEGORY_CODES.get(cat, "unknown"), str(e.get("error") or ""), category=cat or None)
