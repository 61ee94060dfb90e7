"""Deliver reminders to providers: immutable envelopes in, exactly one result each out.

Nothing here knows Django, the ORM or Celery (an import-linter contract says so). A worker
builds envelopes with the ORM, delivers each chunk on one ``Session`` and records the results
after: no ORM call inside the loop, no event loop outliving its session. delivery.engine runs
a batch (concurrency, timeouts, retries, the limiter, a clean stop); delivery.errors says what
is retried. Time comes only from the injected ``clock``.
"""

from delivery.channel import Channel
from delivery.engine import deliver
from delivery.envelope import Attachment, Envelope, FrozenMap
from delivery.errors import (
    DeliveryError,
    HedgePermanentError,
    HedgeRefusedError,
    HedgeTransientError,
    OutcomeUnknownError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from delivery.limits import DeliveryLimits
from delivery.results import DeliveryResult, Outcome
from delivery.session import Session

__all__ = [
    "Attachment",
    "Channel",
    "DeliveryError",
    "DeliveryLimits",
    "DeliveryResult",
    "Envelope",
    "FrozenMap",
    "HedgePermanentError",
    "HedgeRefusedError",
    "HedgeTransientError",
    "Outcome",
    "OutcomeUnknownError",
    "PermanentError",
    "RateLimitedError",
    "Session",
    "TransientError",
    "deliver",
]
