"""The numbers that shape a delivery batch, checked once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DeliveryLimits"]

DEFAULT_CONCURRENCY = 10
DEFAULT_CALL_TIMEOUT = 10.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_BACKOFF_BASE = 0.5
DEFAULT_BACKOFF_MAX = 30.0
DEFAULT_JITTER = 0.2
# Below a typical Celery soft time limit (300 s), so a batch stops itself first.
DEFAULT_BUDGET = 240.0
DEFAULT_MIN_CALL_WINDOW = 2.0


def _check_int(name: str, value: object, hint: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"DeliveryLimits.{name} must be an integer >= 1 (got {value!r}); {hint}")


def _check_seconds(name: str, value: object, *, allow_zero: bool, hint: str) -> None:
    bound = ">= 0" if allow_zero else "> 0"
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        raise ValueError(
            f"DeliveryLimits.{name} must be a finite number of seconds {bound} (got {value!r}); "
            f"{hint}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryLimits:
    """How hard and how fast to try.

    ``concurrency`` caps provider calls in flight; ``call_timeout`` bounds one
    call; ``max_attempts`` caps calls per envelope; the n-th retry waits
    ``min(backoff_max, backoff_base * 2**(n-1))`` reduced by up to ``jitter``
    (a fraction) at random, and at least the provider's ``retry_after``;
    ``budget`` bounds the whole batch, after which it stops like a stop signal.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_max: float = DEFAULT_BACKOFF_MAX
    jitter: float = DEFAULT_JITTER
    budget: float = DEFAULT_BUDGET
    #: Seconds that calls already in flight may still take once the budget is
    #: used up (no new call starts meanwhile); 0 cancels them at once. On a
    #: channel without idempotency keys a cancelled call is an unknown outcome,
    #: so letting it finish (within ``call_timeout``) keeps outcomes known.
    drain: float = 0.0
    #: Seconds the channel may take to close (SMTP QUIT, HTTP pool shutdown)
    #: once the batch has ended; the results are decided before it.
    close_timeout: float = DEFAULT_CALL_TIMEOUT
    #: A call is not started with less than this many seconds left before the
    #: reminder's deadline: a provider slower than what is left cuts it off at
    #: the deadline, when it may have reached the provider and cannot be
    #: repeated (after the deadline not even under an idempotency key). The
    #: reminder ends not sent (missed), and known, instead. 0 disables it.
    min_call_window: float = DEFAULT_MIN_CALL_WINDOW

    def __post_init__(self) -> None:
        _check_int("concurrency", self.concurrency, "pass how many provider calls may run at once.")
        _check_int("max_attempts", self.max_attempts, "pass 1 to disable retries.")
        _check_seconds(
            "call_timeout", self.call_timeout, allow_zero=False, hint="every call needs a bound."
        )
        _check_seconds(
            "backoff_base", self.backoff_base, allow_zero=True, hint="pass 0 to retry at once."
        )
        _check_seconds(
            "backoff_max", self.backoff_max, allow_zero=True, hint="pass the longest single wait."
        )
        if self.backoff_max < self.backoff_base:
            raise ValueError(
                f"DeliveryLimits.backoff_max ({self.backoff_max}) is below backoff_base "
                f"({self.backoff_base}); raise backoff_max or lower backoff_base."
            )
        if (
            not isinstance(self.jitter, int | float)
            or isinstance(self.jitter, bool)
            or not 0 <= self.jitter <= 1
        ):
            raise ValueError(
                f"DeliveryLimits.jitter must be a fraction between 0 and 1 (got {self.jitter!r}); "
                "0.2 shortens each wait by up to 20%."
            )
        _check_seconds(
            "budget", self.budget, allow_zero=False, hint="set it below the task's time limit."
        )
        _check_seconds(
            "drain", self.drain, allow_zero=True, hint="pass 0 to cancel calls at the budget."
        )
        _check_seconds(
            "close_timeout", self.close_timeout, allow_zero=False, hint="closing needs a bound."
        )
        _check_seconds(
            "min_call_window",
            self.min_call_window,
            allow_zero=True,
            hint="pass 0 to start calls until the deadline.",
        )

    def backoff(self, retry: int, *, draw: float, retry_after: float | None = None) -> float:
        """Return the wait before retry number ``retry`` (1 for the first retry).

        ``draw`` is a number in [0, 1) from the injected random source. Jitter
        only shortens the wait, so ``backoff_max`` is never exceeded and
        workers that failed together do not retry together.
        """
        exponent = min(max(retry - 1, 0), 62)
        delay = min(self.backoff_max, self.backoff_base * 2.0**exponent)
        delay *= 1.0 - self.jitter * min(max(draw, 0.0), 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay
