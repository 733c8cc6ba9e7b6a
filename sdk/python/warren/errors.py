"""The exceptions of the Warren SDK.

Every failed call raises a :class:`WarrenError`. Its subclasses mirror the
daemon's error categories, so callers can catch what they can handle::

    WarrenError
    ├── NotFoundError             the sandbox, process, file, image or layer is not there
    ├── InvalidError              the request is wrong (bad argument, bad path...)
    ├── ExhaustedError            a limit was hit (too many processes, body too large, a download budget)
    ├── ConflictError             the object is in the wrong state
    │   └── AlreadyExistsError    ... because it exists already (duplicate id or name)
    ├── UnavailableError          the daemon cannot be reached or is shutting down
    ├── DeadlineExceededError     the daemon gave up waiting (server-side deadline)
    │   └── TimeoutError          the client's own deadline passed (client-side)
    ├── UnauthenticatedError      missing or wrong bearer token
    ├── PermissionDeniedError     refused: a path or action Warren never touches
    ├── InternalError             a bug or an unexpected failure in the daemon
    ├── UnsupportedError          the node's backend cannot do this call (never retried)
    ├── CommandError              ExecResult.check(): the command failed
    └── BatchError                a batch helper was asked to be strict and some items failed

:class:`TimeoutError` is also a subclass of the built-in :class:`TimeoutError`,
so ``except TimeoutError`` (and, on Python >= 3.11, ``asyncio.TimeoutError``)
catches it as well.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Type

if TYPE_CHECKING:  # pragma: no cover
    from ._types import ExecResult

__all__ = [
    "WarrenError",
    "NotFoundError",
    "InvalidError",
    "ExhaustedError",
    "ConflictError",
    "AlreadyExistsError",
    "UnavailableError",
    "DeadlineExceededError",
    "TimeoutError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "InternalError",
    "UnsupportedError",
    "CommandError",
    "BatchError",
    "OutputTruncatedWarning",
]


class WarrenError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        message: the daemon's (or the client's) explanation.
        code: the Connect/gRPC status code name, e.g. ``"not_found"``, or
            ``None`` for client-side errors.
        category: the daemon's error category, e.g. ``"not_found"``.
        http_status: the HTTP status of the failed response, if there was one.
        procedure: the RPC or HTTP path that failed, if known.
    """

    category_name = "unknown"
    #: True when an earlier attempt of the same call failed in a way that
    #: may have reached the daemon (so e.g. NotFound may be our own doing).
    after_ambiguous_failure: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        category: Optional[str] = None,
        http_status: Optional[int] = None,
        procedure: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.category = category or self.category_name
        self.http_status = http_status
        self.procedure = procedure

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> Any:  # keep keyword attributes across pickling
        return (
            _rebuild,
            (type(self), self.message, self.code, self.category, self.http_status, self.procedure),
        )


def _rebuild(
    cls: Type[WarrenError],
    message: str,
    code: Optional[str],
    category: Optional[str],
    http_status: Optional[int],
    procedure: Optional[str],
) -> WarrenError:
    return cls(message, code=code, category=category, http_status=http_status, procedure=procedure)


class NotFoundError(WarrenError):
    """The sandbox, process, file, image or named layer does not exist."""

    category_name = "not_found"


class InvalidError(WarrenError):
    """The request is invalid (a bad argument, path, id, mode...)."""

    category_name = "invalid"


class ExhaustedError(WarrenError):
    """A resource limit was reached (processes per sandbox, body size...).

    Raised by the client itself (``code`` None) when a download or read
    exceeds its budget; ``limit`` then names the argument to raise
    (``"max_bytes"`` or ``"max_entries"``)."""

    category_name = "exhausted"
    #: the client-side budget that was exceeded, or None (a daemon limit)
    limit: Optional[str] = None


class ConflictError(WarrenError):
    """The object is in a state that does not allow the call."""

    category_name = "conflict"


class AlreadyExistsError(ConflictError):
    """A sandbox id or image name is taken."""


class UnavailableError(WarrenError):
    """The daemon could not be reached, or is shutting down. Transient."""

    category_name = "unavailable"


class DeadlineExceededError(WarrenError):
    """A deadline passed on the daemon's side (e.g. ``Process.wait(timeout=...)``)."""

    category_name = "deadline_exceeded"


class TimeoutError(DeadlineExceededError, builtins.TimeoutError):  # noqa: A001
    """The client-side deadline of a call passed.

    The HTTP request was closed, which makes the daemon cancel the work (an
    exec in flight is killed).
    """

    def __init__(self, message: str, *, timeout: Optional[float] = None, procedure: Optional[str] = None) -> None:
        super().__init__(message, code="deadline_exceeded", category="deadline_exceeded", procedure=procedure)
        self.timeout = timeout

    def __reduce__(self) -> Any:
        return (_rebuild_timeout, (self.message, self.timeout, self.procedure))


def _rebuild_timeout(message: str, timeout: Optional[float], procedure: Optional[str]) -> "TimeoutError":
    return TimeoutError(message, timeout=timeout, procedure=procedure)


class UnauthenticatedError(WarrenError):
    """The bearer token is missing or wrong."""

    category_name = "unauthenticated"


class PermissionDeniedError(WarrenError):
    """The daemon knows the caller but refuses the call: for example a file
    call into a sandbox's ``/proc`` or ``/sys``, which Warren never touches."""

    category_name = "permission_denied"


class InternalError(WarrenError):
    """The daemon failed unexpectedly."""

    category_name = "internal"


class UnsupportedError(WarrenError):
    """The node's backend cannot do this call at all (for example commit, or
    a live change of limits, on a backend without them). Permanent for that
    node, so it is never retried; the code is ``unimplemented`` (HTTP 501)."""

    category_name = "unsupported"


class CommandError(WarrenError):
    """Raised by :meth:`ExecResult.check` (and ``exec(check=True)``) when a
    command exited non-zero, was killed, timed out or had its output
    truncated. ``result`` holds the full :class:`~warren.ExecResult`."""

    category_name = "command"

    def __init__(self, message: str, result: "ExecResult") -> None:
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> Any:
        return (CommandError, (self.message, self.result))


class BatchError(WarrenError):
    """Some items of a strict batch failed. ``errors`` holds ``(index, exception)``
    pairs for every failed item; the first one is also the ``__cause__``."""

    category_name = "batch"

    def __init__(self, message: str, errors: Sequence[Tuple[int, BaseException]]) -> None:
        super().__init__(message)
        self.errors: List[Tuple[int, BaseException]] = list(errors)

    def __reduce__(self) -> Any:
        return (BatchError, (self.message, self.errors))


class OutputTruncatedWarning(UserWarning):
    """Warned when an exec's output exceeded its limit and was cut (see
    ``AsyncWarren(on_truncation=...)``)."""


# Connect codes (and a few HTTP-only names) to exception classes.
_CODE_CLASSES: Dict[str, Type[WarrenError]] = {
    "not_found": NotFoundError,
    "invalid_argument": InvalidError,
    "out_of_range": InvalidError,
    "resource_exhausted": ExhaustedError,
    "already_exists": AlreadyExistsError,
    "failed_precondition": ConflictError,
    "aborted": ConflictError,
    "unavailable": UnavailableError,
    "deadline_exceeded": DeadlineExceededError,
    "unauthenticated": UnauthenticatedError,
    "permission_denied": PermissionDeniedError,
    "internal": InternalError,
    "unknown": InternalError,
    "data_loss": InternalError,
    "unimplemented": UnsupportedError,
    "canceled": UnavailableError,
}

# The daemon's categories (the Warren-Error-Category header).
_CATEGORY_CLASSES: Dict[str, Type[WarrenError]] = {
    "not_found": NotFoundError,
    "invalid": InvalidError,
    "exhausted": ExhaustedError,
    "conflict": ConflictError,
    "unavailable": UnavailableError,
    "deadline_exceeded": DeadlineExceededError,
    "unauthenticated": UnauthenticatedError,
    "permission_denied": PermissionDeniedError,
    "internal": InternalError,
    "unsupported": UnsupportedError,
}

_HTTP_CODES: Dict[int, str] = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    408: "deadline_exceeded",
    409: "failed_precondition",
    412: "failed_precondition",
    413: "resource_exhausted",
    415: "internal",
    429: "resource_exhausted",
    499: "canceled",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
}


def code_for_http_status(status: int) -> str:
    """The Connect code name a bare HTTP status stands for."""
    return _HTTP_CODES.get(status, "internal" if status >= 500 else "unknown")


def error_from_status(
    code: Optional[str],
    message: str,
    *,
    category: Optional[str] = None,
    http_status: Optional[int] = None,
    procedure: Optional[str] = None,
) -> WarrenError:
    """Build the exception for a failed call from its code and category.

    The category (from the ``Warren-Error-Category`` header) decides the
    class, except that ``already_exists`` refines a conflict."""
    if not code and http_status is not None:
        code = code_for_http_status(http_status)
    cls: Optional[Type[WarrenError]] = None
    if code == "already_exists":
        cls = AlreadyExistsError
    elif category:
        cls = _CATEGORY_CLASSES.get(category)
    if cls is None:
        cls = _CODE_CLASSES.get(code or "", InternalError)
    if not message:
        message = code or (f"HTTP {http_status}" if http_status else "unknown error")
    return cls(message, code=code, category=category, http_status=http_status, procedure=procedure)
