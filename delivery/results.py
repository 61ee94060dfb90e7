"""Delivery results, one per envelope."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Outcome", "DeliveryResult"]


class Outcome(StrEnum):
    """How the delivery of one envelope ended."""

    SENT = "sent"
    #: Attempts or time ran out on transient failures.
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    #: The last call exceeded ``call_timeout``; the provider may have the message.
    TIMED_OUT = "timed_out"
    #: A stop signal or the batch budget ended the envelope.
    CANCELLED = "cancelled"
    #: The deadline passed before any call started.
    EXPIRED = "expired"
    #: The gate withdrew the envelope; no call started after the withdrawal.
    WITHDRAWN = "withdrawn"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryResult:
    """The outcome of one envelope.

    ``provider_reached`` is False only when surely no call reached the provider (a re-send
    cannot duplicate); ``maybe_delivered`` is True for ``SENT`` or if a call had no clear answer.
    """

    reminder_id: int
    key: str
    outcome: Outcome
    message_id: str | None
    error: str
    attempts: int
    provider_reached: bool
    maybe_delivered: bool

    @property
    def ok(self) -> bool:
        """Return True when the provider accepted the message."""
        return self.outcome is Outcome.SENT
