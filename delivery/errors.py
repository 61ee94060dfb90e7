"""Failures a channel reports, and which of them are worth another attempt.

The tree, with what the engine does for each (see ``delivery`` for the whole story)::

    DeliveryError                  base; a channel's account of a failed send
    ├── TransientError             retried with backoff within the deadline
    │   ├── RateLimitedError       the provider's rate limit (HTTP 429); also pauses the limiter
    │   ├── OutcomeUnknownError    the request may have been accepted, the answer was lost;
    │   │                          retried only on channels that honour idempotency keys
    │   └── HedgeTransientError    every hedged endpoint failed, at least one transiently
    └── PermanentError             never retried (bad address, rejected by the provider)
        └── HedgePermanentError    every hedged endpoint failed permanently

``HedgeRefusedError`` (a ``ValueError``) is a programming error, not a delivery
failure: hedging was asked for across a channel that does not honour keys.
"""

from __future__ import annotations

import math

__all__ = [
    "DeliveryError",
    "TransientError",
    "RateLimitedError",
    "OutcomeUnknownError",
    "PermanentError",
    "HedgeError",
    "HedgeTransientError",
    "HedgePermanentError",
    "HedgeRefusedError",
]


class DeliveryError(Exception):
    """Describe a send that did not succeed.

    ``reached`` is False only when the channel is certain the provider never
    saw the request (the connection was refused, the input was rejected
    locally). ``maybe_delivered`` is True when the provider may have accepted
    the message although the call failed (the answer was lost).
    """

    def __init__(self, message: str, *, reached: bool = True, maybe_delivered: bool = False):
        super().__init__(message)
        self.message = message
        self.reached = reached
        self.maybe_delivered = maybe_delivered

    def __str__(self) -> str:
        return self.message


class TransientError(DeliveryError):
    """Report a failure that may succeed later; ``retry_after`` is the provider's hint."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        *,
        reached: bool = True,
        maybe_delivered: bool = False,
    ):
        if retry_after is not None and (not math.isfinite(retry_after) or retry_after < 0):
            raise ValueError(
                f"retry_after must be a finite number of seconds >= 0 or None (got {retry_after!r})."
            )
        super().__init__(message, reached=reached, maybe_delivered=maybe_delivered)
        self.retry_after = retry_after


class RateLimitedError(TransientError):
    """Report that the provider's account-wide rate limit refused the call.

    The engine pauses the shared rate limiter for ``retry_after`` seconds (one
    window when absent) so every worker slows down, not just this envelope.
    """


class OutcomeUnknownError(TransientError):
    """Report that the request was sent but its answer was lost.

    The provider may have accepted it, so a retry is safe only where the
    provider deduplicates by idempotency key.
    """

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message, retry_after, reached=True, maybe_delivered=True)


class PermanentError(DeliveryError):
    """Report a failure that another attempt would repeat."""

    def __init__(self, message: str, *, reached: bool = True):
        super().__init__(message, reached=reached, maybe_delivered=False)


def _describe(failures: tuple[tuple[str, BaseException], ...]) -> str:
    parts = [f"{name}: {type(exc).__name__}: {exc}" for name, exc in failures]
    return f"all {len(failures)} hedged endpoints failed: " + "; ".join(parts)


class HedgeError(DeliveryError):
    """Base of the errors raised when every hedged endpoint failed.

    ``failures`` holds ``(endpoint name, exception)`` for every endpoint, in the
    order the endpoints were given.
    """

    failures: tuple[tuple[str, BaseException], ...]


class HedgeTransientError(HedgeError, TransientError):
    """Every hedged endpoint failed and at least one failure may pass."""

    def __init__(
        self,
        failures: tuple[tuple[str, BaseException], ...],
        retry_after: float | None = None,
        *,
        reached: bool,
        maybe_delivered: bool,
    ):
        TransientError.__init__(
            self,
            _describe(failures),
            retry_after,
            reached=reached,
            maybe_delivered=maybe_delivered,
        )
        self.failures = failures


class HedgePermanentError(HedgeError, PermanentError):
    """Every hedged endpoint refused the message permanently."""

    def __init__(self, failures: tuple[tuple[str, BaseException], ...], *, reached: bool):
        PermanentError.__init__(self, _describe(failures), reached=reached)
        self.failures = failures


class HedgeRefusedError(ValueError):
    """Refuse to hedge across a channel that does not honour idempotency keys."""
