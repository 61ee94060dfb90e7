"""Delivery results, one per envelope, and their summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

__all__ = ["Outcome", "DeliveryResult", "Summary", "summarise"]


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

    ``provider_reached`` is False only when it is certain no call reached the
    provider, so a re-send cannot duplicate. ``maybe_delivered`` is True for
    ``SENT`` and for a failure where some call ended without a definite answer.
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


@dataclass(frozen=True, slots=True)
class Summary:
    """A batch's results grouped by reminder id.

    ``CANCELLED`` and ``WITHDRAWN`` results are ``unfinished``, not failures:
    the caller releases them for a later batch (or marks them unknown when
    ``maybe_delivered``).
    """

    successes: Mapping[int, DeliveryResult]
    failures: Mapping[int, DeliveryResult]
    unfinished: Mapping[int, DeliveryResult]
    counts: Mapping[Outcome, int]

    @property
    def total(self) -> int:
        """Return how many results were summarised."""
        return len(self.successes) + len(self.failures) + len(self.unfinished)


def summarise(results: Iterable[DeliveryResult]) -> Summary:
    """Group ``results`` by reminder id; raise ``ValueError`` on a repeated id."""
    successes: dict[int, DeliveryResult] = {}
    failures: dict[int, DeliveryResult] = {}
    unfinished: dict[int, DeliveryResult] = {}
    counts: Counter[Outcome] = Counter()
    for result in results:
        rid = result.reminder_id
        if rid in successes or rid in failures or rid in unfinished:
            raise ValueError(
                f"reminder {rid} has two results; summarise() needs one result per reminder id."
            )
        counts[result.outcome] += 1
        if result.outcome is Outcome.SENT:
            successes[rid] = result
        elif result.outcome in (Outcome.CANCELLED, Outcome.WITHDRAWN):
            unfinished[rid] = result
        else:
            failures[rid] = result
    return Summary(
        successes=MappingProxyType(successes),
        failures=MappingProxyType(failures),
        unfinished=MappingProxyType(unfinished),
        counts=MappingProxyType({outcome: counts[outcome] for outcome in Outcome}),
    )
