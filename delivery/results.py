"""What a delivery returns: exactly one result per envelope, and a summary of them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

__all__ = ["Outcome", "DeliveryResult", "Summary", "summarise"]


class Outcome(StrEnum):
    """How the delivery of one envelope ended."""

    #: The provider accepted the message.
    SENT = "sent"
    #: Transient failures until attempts or time ran out (read ``provider_reached``).
    TRANSIENT = "transient"
    #: The provider or the input refused the message; another attempt would repeat it.
    PERMANENT = "permanent"
    #: The last call exceeded ``call_timeout``; the provider may have accepted it.
    TIMED_OUT = "timed_out"
    #: A stop signal or the batch budget ended the envelope before it finished.
    CANCELLED = "cancelled"
    #: The deadline passed before any provider call started; the provider was never called.
    EXPIRED = "expired"
    #: The caller's gate withdrew the envelope before a call started (the workshop or
    #: enrollment was cancelled, or the message content changed): no call was made for it
    #: after the withdrawal; ``attempts`` counts the calls made before it.
    WITHDRAWN = "withdrawn"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryResult:
    """The outcome of one envelope.

    ``attempts`` counts ``channel.send`` calls started. ``provider_reached`` is
    False only when it is certain that no call reached the provider (nothing
    started, or every call failed before connecting): the message can then be
    sent again without any risk of a duplicate. ``maybe_delivered`` is True when
    the provider may hold the message: it is True for ``SENT``, and for a
    failure when some call ended without a definite answer (timed out,
    cancelled in flight, connection lost after sending, unexpected error).
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

    ``CANCELLED`` results go to ``unfinished``, neither success nor failure:
    a stop signal says nothing about the message, so the caller must release
    those reminders for a later batch (or mark them unknown when
    ``maybe_delivered``) instead of recording a failure that never happened.
    Counting cancellation as a failure would turn every warm shutdown into
    a wave of false ``failed`` statuses.
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
    """Group ``results`` into successes, failures and unfinished, keyed by reminder id.

    Raise ``ValueError`` when a reminder id appears twice: keyed results would
    silently lose one of them.
    """
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
