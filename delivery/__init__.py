"""Deliver reminders to providers: immutable envelopes in, exactly one result each out.

Nothing here knows Django, the ORM or Celery (an import-linter contract says
so). A worker prepares envelopes with the ORM, opens one ``Session``
(delivery.session) and calls its ``deliver`` per chunk, then records the
``DeliveryResult`` values with the ORM: no ORM call happens inside the loop,
and no event loop outlives its session. ``deliver`` (delivery.engine) runs one
batch: concurrency, per-call timeouts, retries with backoff, the rate
limiter (delivery.limiter) and a clean stop; how each failure is retried is
in delivery.errors, where cancellation lands in delivery.engine. Time comes
only from the injected ``clock``.
"""

from delivery.channel import Channel
from delivery.engine import deliver
from delivery.envelope import Attachment, Envelope, FrozenMap
from delivery.errors import (
    DeliveryError,
    HedgeError,
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
    "HedgeError",
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
