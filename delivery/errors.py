"""Delivery failures, and which of them the engine retries.

Anything else a channel raises ends only its envelope: ``OSError`` counts as
``OutcomeUnknownError``, any other exception as ``PERMANENT`` and possibly delivered (a bug
another try repeats).
"""

from __future__ import annotations

__all__ = [
    "DeliveryError",
    "TransientError",
    "RateLimitedError",
    "OutcomeUnknownError",
    "PermanentError",
    "HedgeTransientError",
    "HedgePermanentError",
    "HedgeRefusedError",
]


class DeliveryError(Exception):
    """A failed send.

    ``reached`` is False only when the provider certainly never saw the
    request; ``maybe_delivered`` is True when it may have accepted it anyway.
    """

    def __init__(self, message: str, *, reached: bool = True, maybe_delivered: bool = False):
        super().__init__(message)
        self.reached = reached
        self.maybe_delivered = maybe_delivered


class TransientError(DeliveryError):
    """A failure retried with backoff within the deadline; ``retry_after``: the provider's hint."""

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        *,
        reached: bool = True,
        maybe_delivered: bool = False,
    ):
        super().__init__(message, reached=reached, maybe_delivered=maybe_delivered)
        self.retry_after = retry_after


class RateLimitedError(TransientError):
    """The provider's rate limit refused the call; the engine pauses the shared limiter."""


class OutcomeUnknownError(TransientError):
    """The request was sent and its answer lost; retry only where keys are honoured."""

    def __init__(self, message: str):
        super().__init__(message, reached=True, maybe_delivered=True)


class PermanentError(DeliveryError):
    """A failure that another attempt would repeat: never retried."""

    def __init__(self, message: str, *, reached: bool = True):
        super().__init__(message, reached=reached, maybe_delivered=False)


def _describe(failures: tuple[tuple[str, BaseException], ...]) -> str:
    parts = [f"{name}: {type(exc).__name__}: {exc}" for name, exc in failures]
    return f"all {len(failures)} hedged endpoints failed: " + "; ".join(parts)


class HedgeTransientError(TransientError):
    """Every hedged endpoint failed, at least one transiently; ``failures``: (name, error) each."""

    def __init__(
        self,
        failures: tuple[tuple[str, BaseException], ...],
        retry_after: float | None = None,
        *,
        reached: bool,
        maybe_delivered: bool,
    ):
        super().__init__(
            _describe(failures), retry_after, reached=reached, maybe_delivered=maybe_delivered
        )
        self.failures = failures


class HedgePermanentError(PermanentError):
    """Every hedged endpoint refused the message permanently."""

    def __init__(self, failures: tuple[tuple[str, BaseException], ...], *, reached: bool):
        super().__init__(_describe(failures), reached=reached)
        self.failures = failures


class HedgeRefusedError(ValueError):
    """Refuse to hedge across a channel that does not honour idempotency keys."""
