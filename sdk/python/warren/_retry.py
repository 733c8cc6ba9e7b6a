"""Retry policy: jittered exponential backoff for transient failures."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy", "NO_RETRY"]


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures (connection refused/reset, HTTP 503 or the
    ``unavailable`` code) are retried.

    A call is retried only when that is safe: reads and other idempotent
    calls always; calls that change state only when the failed attempt
    certainly did not reach the daemon (the connection was refused), except
    for ``exec``, which carries an idempotency key so that the daemon never
    runs it twice, and ``create``, which always sends a sandbox id.

    Idempotent, so always retried: deletes and removals (of sandboxes,
    images, layers), plain file writes, ``mkdir``, archive and image
    uploads (unless from a file object that cannot seek), ``import_image``,
    ``build_layer`` (the same input makes the same named layer again) and
    ``pull_image`` (it makes the named image from the reference again,
    reusing the layers already stored; a pull stream that broke after some
    events is started over). Not retried once sent: ``start``, ``signal``,
    ``write_stdin``, appends and ``commit`` (a second commit would snapshot
    the sandbox again, whose files may have changed since).

    The wait before attempt ``n + 1`` is a random duration between 0 and
    ``min(max_backoff, initial_backoff * multiplier ** (n - 1))`` ("full
    jitter"), and never extends past the call's deadline.
    """

    max_attempts: int = 5  #: attempts in all, the first one included; 1 = no retries
    initial_backoff: float = 0.05  #: seconds
    max_backoff: float = 2.0  #: seconds
    multiplier: float = 2.0

    def backoff(self, failed_attempts: int) -> float:
        """The (jittered) delay after ``failed_attempts`` failed attempts."""
        cap = min(self.max_backoff, self.initial_backoff * (self.multiplier ** max(0, failed_attempts - 1)))
        return random.uniform(0.0, cap)


#: A policy that never retries.
NO_RETRY = RetryPolicy(max_attempts=1)
