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
nothing is guessed. Calls through other handles of the same sandbox are
not numbered by the session (they are recorded as their own steps).
Background processes (``start``) are not recorded. The synchronous
:class:`warren.Sandbox` works the same way, with ``with``.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Union

from ._async import AsyncSandbox

__all__ = ["Rollout", "rollout"]


class Rollout:
    """A rollout session on one sandbox handle (see the module doc).

    ``seq`` is the last step number given out; ``replayed`` and ``live``
    count the exec and file calls that were answered from the log and
    that ran."""

    def __init__(self, sandbox: Any, session_id: str, *, start: int = 0) -> None:
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
        return self._attach()

    async def __aexit__(self, *exc: Any) -> None:
        self._detach()

    def __enter__(self) -> "Rollout":
        return self._attach()

    def __exit__(self, *exc: Any) -> None:
        self._detach()

    def __repr__(self) -> str:
        return f"<Rollout {self.session_id!r} on {self._aio.id} seq={self.seq} replayed={self.replayed} live={self.live}>"


def rollout(sandbox: Union[AsyncSandbox, Any], session_id: str, *, start: int = 0) -> Rollout:
    """A rollout session numbering the calls made through ``sandbox``
    (an :class:`AsyncSandbox` or a :class:`Sandbox`): use it with
    ``async with`` or ``with``. ``start`` is the step before the first
    (0: the session's calls are steps 1, 2, ...)."""
    return Rollout(sandbox, session_id, start=start)
