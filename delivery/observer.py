"""What the engine tells an observer while a batch runs: each provider call, each send, each wait.

The engine knows nothing of Prometheus; a caller that wants numbers passes
an ``Observer`` (reminders/worker/telemetry.py is the project's). Its methods are
called on the batch's event loop, between awaits, so they must be quick and
must not block: counting in memory or in a mapped file, never I/O. An
exception an observer raises is logged once per batch and never changes a
delivery's outcome.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["CALL_OUTCOMES", "Observer"]

# How one provider call ended (not how the envelope ended: it may take several calls).
CALL_SENT = "sent"  # the provider accepted the message
CALL_TRANSIENT = "transient"  # refused for now, and certainly not delivered
CALL_PERMANENT = "permanent"  # refused for good (or a bug in the channel)
CALL_TIMEOUT = "timeout"  # cut off by call_timeout or the deadline: it may have arrived
CALL_THROTTLED = "throttled"  # the provider answered 429
CALL_MAYBE_DELIVERED = "maybe_delivered"  # the answer was lost, or a stop cut the call off
CALL_OUTCOMES = (
    CALL_SENT,
    CALL_TRANSIENT,
    CALL_PERMANENT,
    CALL_TIMEOUT,
    CALL_THROTTLED,
    CALL_MAYBE_DELIVERED,
)


@runtime_checkable
class Observer(Protocol):
    """Receive the engine's measurements; every argument is a plain value."""

    def call_ended(self, channel: str, outcome: str, seconds: float) -> None:
        """Count one provider call that took ``seconds`` and ended as ``outcome``."""

    def sent(self, channel: str, slack_seconds: float) -> None:
        """Note a message the provider accepted ``slack_seconds`` before its deadline."""

    def limiter_waited(self, seconds: float) -> None:
        """Note one wait for the rate limiter's grant (it may have ended at a deadline)."""
