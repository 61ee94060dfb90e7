"""The numbers that shape a delivery batch, checked once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DeliveryLimits"]

DEFAULT_MIN_CALL_WINDOW = 2.0


def _check_int(name: str, value: object, hint: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"DeliveryLimits.{name} must be an integer >= 1 (got {value!r}); {hint}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_seconds(limits: DeliveryLimits, *checks: tuple[str, bool, str]) -> None:
    """Check each ``(name, allow_zero, hint)`` field of ``limits`` is finite seconds."""
    for name, allow_zero, hint in checks:
        value = getattr(limits, name)
        bound = ">= 0" if allow_zero else "> 0"
        ok = (
            _is_number(value) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
        )
        if not ok:
            raise ValueError(
                f"DeliveryLimits.{name} must be a finite number of seconds {bound} "
                f"(got {value!r}); {hint}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryLimits:
    """How hard and how fast to try; ``budget`` bounds the whole batch."""

    concurrency: int = 10
    call_timeout: float = 10.0
    max_attempts: int = 3
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.2
    #: Below Celery's soft time limit, so a batch stops itself first.
    budget: float = 240.0
    #: Seconds calls in flight may still take once the budget is used up; 0
    #: cancels them, which leaves their outcome unknown on keyless channels.
    drain: float = 0.0
    #: Seconds the channel may take to close; results are decided before it.
    close_timeout: float = 10.0
    #: No call starts under this many seconds before the deadline: one cut off there has an
    #: unknown outcome that cannot be retried. 0 disables it.
    min_call_window: float = DEFAULT_MIN_CALL_WINDOW

    def __post_init__(self) -> None:
        _check_int("concurrency", self.concurrency, "pass how many provider calls may run at once.")
        _check_int("max_attempts", self.max_attempts, "pass 1 to disable retries.")
        _check_seconds(
            self,
            ("call_timeout", False, "every call needs a bound."),
            ("backoff_base", True, "pass 0 to retry at once."),
            ("backoff_max", True, "pass the longest single wait."),
        )
        if self.backoff_max < self.backoff_base:
            raise ValueError(
                f"DeliveryLimits.backoff_max ({self.backoff_max}) is below backoff_base "
                f"({self.backoff_base}); raise backoff_max or lower backoff_base."
            )
        if not _is_number(self.jitter) or not 0 <= self.jitter <= 1:
            raise ValueError(
                f"DeliveryLimits.jitter must be a fraction between 0 and 1 (got {self.jitter!r}); "
                "0.2 shortens each wait by up to 20%."
            )
        _check_seconds(
            self,
            ("budget", False, "set it below the task's time limit."),
            ("drain", True, "pass 0 to cancel calls at the budget."),
            ("close_timeout", False, "closing needs a bound."),
            ("min_call_window", True, "pass 0 to start calls until the deadline."),
        )

    def backoff(self, retry: int, *, draw: float, retry_after: float | None = None) -> float:
        """Return the wait before retry number ``retry`` (1 for the first).

        ``draw`` is in [0, 1); jitter only shortens the wait, so it never exceeds ``backoff_max``.
        """
        exponent = min(retry - 1, 62)
        delay = min(self.backoff_max, self.backoff_base * 2.0**exponent)
        delay *= 1.0 - self.jitter * draw
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay
