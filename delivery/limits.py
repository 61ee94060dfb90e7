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
# Below Celery's soft time limit, so a batch stops itself first.
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
    """How hard and how fast to try; ``budget`` bounds the whole batch."""

    concurrency: int = DEFAULT_CONCURRENCY
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_max: float = DEFAULT_BACKOFF_MAX
    jitter: float = DEFAULT_JITTER
    budget: float = DEFAULT_BUDGET
    #: Seconds calls in flight may still take once the budget is used up; 0
    #: cancels them, which leaves their outcome unknown on keyless channels.
    drain: float = 0.0
    #: Seconds the channel may take to close; results are decided before it.
    close_timeout: float = DEFAULT_CALL_TIMEOUT
    #: No call starts under this many seconds before the deadline: one cut off there has an
    #: unknown outcome that cannot be retried. 0 disables it.
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
        """Return the wait before retry number ``retry`` (1 for the first).

        ``draw`` is in [0, 1); jitter only shortens the wait, so it never exceeds ``backoff_max``.
        """
        exponent = min(max(retry - 1, 0), 62)
        delay = min(self.backoff_max, self.backoff_base * 2.0**exponent)
        delay *= 1.0 - self.jitter * min(max(draw, 0.0), 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay
