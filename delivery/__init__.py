"""Deliver reminders to providers: immutable envelopes in, exactly one result each out.

This package knows nothing of Django, the ORM or Celery (an import-linter
contract enforces it). Its only crossing between synchronous and
asynchronous code is this one, in a Celery task:

1. prepare envelopes with the ORM (claim rows, build ``Envelope`` values);
2. open one ``Session(channel_factory, clock=...)`` (delivery.session) and call
   its ``deliver`` per chunk, so the chunks share one loop, channel and limiter;
3. record the ``DeliveryResult`` values with the ORM afterwards.

No ORM call happens inside the loop (a session's loop runs only inside
``deliver``), and no event loop outlives its call or its session.

Public API
----------
``Envelope``, ``Attachment``           the input (frozen)
``DeliveryLimits``                     concurrency, timeouts, retries, budget
``Channel``                            protocol; implementations in ``delivery.channels``
``deliver``                            run a batch inside an event loop
``Session``                            several batches from sync code on one loop and channel
``DeliveryResult``, ``Outcome``        the output, one per envelope, in order
``summarise`` -> ``Summary``           successes / failures / unfinished by reminder id
``delivery.limiter``                   ``LocalRateLimiter``, ``RedisRateLimiter``
``delivery.hedge``                     ``hedged_send`` (the http channel's REMINDERS_HTTP_HEDGE_URLS)
``delivery.observer``                  ``Observer``: told of each call, send and limiter wait

Exceptions
----------
Channels report failures with this tree (``delivery.errors``)::

    DeliveryError                   (reached, maybe_delivered)
    ├── TransientError              retried: backoff, within max_attempts and the deadline
    │   ├── RateLimitedError        429; retried, and the rate limiter pauses for everyone
    │   ├── OutcomeUnknownError     answer lost after sending; retried only if the channel
    │   │                           honours idempotency keys, else ends the envelope
    │   └── HedgeTransientError     all hedged endpoints failed, some transiently
    └── PermanentError              not retried
        └── HedgePermanentError     all hedged endpoints failed permanently

Anything else a channel raises is a per-envelope failure, never a crash of
the batch: ``OSError`` (network trouble the channel did not translate) is
treated like ``OutcomeUnknownError``; any other exception is a bug that
another attempt would repeat, so it is ``PERMANENT``, logged with its
traceback, and counted as possibly delivered. The engine's own call timeout
ends a call ``TIMED_OUT``; it is retried only where keys make that safe.

``deliver`` itself raises only when the batch cannot run at all: the same
reminder id twice (``ValueError``). A ``Session`` raises ``RuntimeError``
when opened inside a running event loop.

Where cancellation lands
------------------------
A stop signal, the budget running out, a call timeout or a lost hedge
cancels a task wherever it awaits: inside ``channel.send`` (the channel's
cleanup runs; the call counts as possibly delivered), in the rate limiter's
``acquire`` (the wait is abandoned; no call starts), in a backoff sleep, or
while waiting for a concurrency slot. Envelopes that never started a call
are reported ``CANCELLED`` with ``provider_reached=False``. Cancelling
``deliver`` itself (rather than setting ``stop``) propagates
``CancelledError`` after the same cleanup, without results.

Time comes only from the injected ``clock``: wall-clock ``now()`` for
deadlines, monotonic time for timeouts, backoff and rate windows.
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
from delivery.results import DeliveryResult, Outcome, Summary, summarise
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
    "Summary",
    "TransientError",
    "deliver",
    "summarise",
]
