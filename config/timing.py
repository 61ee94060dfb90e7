"""Every time bound around a delivery batch, derived in one place so each fits inside the next.

A batch starts provider calls for ``budget`` seconds; then calls in flight
get the ``drain`` to finish, the channel gets ``close`` to shut, and the
outcomes get ``record_retry`` to reach a database that may be restarting;
``setup`` covers the claims and rendering between chunks. That is the
longest a healthy batch runs (``work``). Around it, each bound must hold
the one before it with a margin:

    work < soft time limit < hard time limit < claim lease < visibility timeout

- The soft limit is the safety net: when it fires, the batch stops like a
  warm shutdown (drain, close, record), so the hard limit leaves room for that.
- The hard limit kills the process; the lease, longer still, keeps the reaper
  away from a worker that is still alive.
- Redis redelivers an unacknowledged message after the visibility timeout,
  which must outlast everything a live worker may still be doing.

Pure arithmetic, no Django: config/settings.py builds the values from the
environment, and tests/config/test_timing.py checks the nesting over the
whole range of valid settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Claims and rendering of every chunk of a batch, between provider calls.
SETUP_SECONDS = 10.0
# How long a finished chunk keeps trying to record its outcome while the
# database is unreachable (a restart, a failover).
RECORD_RETRY_SECONDS = 30.0
# Most a channel may take to close once its batch ended.
CLOSE_MAX_SECONDS = 10.0
# The least room between one bound and the next.
MARGIN_SECONDS = 10.0
# How much longer than the hard limit a claim's lease lasts.
LEASE_AFTER_HARD_LIMIT = 60.0


@dataclass(frozen=True, slots=True)
class TimeBounds:
    """The bounds of one delivery batch, in seconds, each inside the next."""

    budget: float
    drain: float
    close: float
    record_retry: float
    setup: float
    work: float
    soft_limit: float
    hard_limit: float
    lease: float
    visibility_timeout: float
    stop_grace: float

    @classmethod
    def derive(
        cls, *, budget: float, call_timeout: float, visibility_timeout: float | None = None
    ) -> TimeBounds:
        """Return the bounds for REMINDERS_BATCH_BUDGET and REMINDERS_CALL_TIMEOUT.

        ``visibility_timeout`` is the operator's REMINDERS_VISIBILITY_TIMEOUT,
        if set; a value that does not outlast the lease raises ``ValueError``
        saying what it must be at least.
        """
        drain = float(call_timeout)
        close = min(float(call_timeout), CLOSE_MAX_SECONDS)
        # After a stop (warm shutdown, soft time limit): drain, close, record.
        stop_grace = drain + close + RECORD_RETRY_SECONDS
        work = budget + SETUP_SECONDS + stop_grace
        soft_limit = work + MARGIN_SECONDS
        hard_limit = soft_limit + stop_grace + MARGIN_SECONDS
        lease = hard_limit + LEASE_AFTER_HARD_LIMIT
        least_visibility = lease + MARGIN_SECONDS
        if visibility_timeout is None:
            visibility_timeout = lease + 2 * LEASE_AFTER_HARD_LIMIT
        elif visibility_timeout < least_visibility:
            raise ValueError(
                f"REMINDERS_VISIBILITY_TIMEOUT must be at least {least_visibility:g} seconds with "
                f"REMINDERS_BATCH_BUDGET={budget:g} and REMINDERS_CALL_TIMEOUT={call_timeout:g} "
                f"(the claim lease, {lease:g} s, plus {MARGIN_SECONDS:g}); got "
                f"{visibility_timeout:g}. Raise it, or unset it to use the derived default."
            )
        return cls(
            budget=float(budget),
            drain=drain,
            close=close,
            record_retry=RECORD_RETRY_SECONDS,
            setup=SETUP_SECONDS,
            work=work,
            soft_limit=soft_limit,
            hard_limit=hard_limit,
            lease=lease,
            visibility_timeout=float(visibility_timeout),
            stop_grace=stop_grace,
        )

    def nesting(self) -> list[tuple[str, float, str, float]]:
        """Return each (inner, seconds, outer, seconds) pair that must nest with a margin."""
        chain = ["work", "soft_limit", "hard_limit", "lease", "visibility_timeout"]
        values = asdict(self)
        pairs = [(a, values[a], b, values[b]) for a, b in zip(chain, chain[1:], strict=False)]
        # What a batch does once its budget is used up (or a stop arrives) fits in work,
        # and what the soft limit's stop does fits between it and the hard limit.
        pairs.append(("budget + stop_grace", self.budget + self.stop_grace, "work", self.work))
        pairs.append(
            (
                "soft_limit + stop_grace",
                self.soft_limit + self.stop_grace,
                "hard_limit",
                self.hard_limit,
            )
        )
        return pairs
