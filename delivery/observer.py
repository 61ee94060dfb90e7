"""Measurements the engine reports while a batch runs.

Observer methods run on the batch's event loop, so they must not block (no
I/O). An exception they raise is logged and never changes an outcome.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["CALL_OUTCOMES", "Observer"]

# How one provider call ended (an envelope may take several calls).
CALL_SENT = "sent"
CALL_TRANSIENT = "transient"  # certainly not delivered
CALL_PERMANENT = "permanent"
CALL_TIMEOUT = "timeout"  # may have arrived
CALL_THROTTLED = "throttled"
CALL_MAYBE_DELIVERED = "maybe_delivered"  # answer lost, or cut off by a stop
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
    """Receive the engine's measurements as plain values."""

    def call_ended(self, channel: str, outcome: str, seconds: float, kind: str) -> None:
        """Count one provider call for a message of ``kind`` (Envelope.kind)."""

    def sent(self, channel: str, slack_seconds: float, kind: str) -> None:
        """Count a message of ``kind`` accepted ``slack_seconds`` before its deadline."""

    def limiter_waited(self, seconds: float) -> None:
        """Count one wait for the rate limiter."""
