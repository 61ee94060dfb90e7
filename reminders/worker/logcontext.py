"""What every log line about a reminder carries: its id, key, claim token, worker and attempt.

``claim_context`` sets the claim around each chunk; ``ReminderFields`` (a handler filter) adds
its fields to each record. Async tasks copy their context, so the engine's see the claim.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClaimContext:
    token: str
    worker: str
    attempts: Mapping[int, int]


_claim: contextvars.ContextVar[ClaimContext | None] = contextvars.ContextVar(
    "reminders_claim", default=None
)


@contextmanager
def claim_context(*, token, worker: str, attempts: Mapping[int, int]) -> Iterator[None]:
    """Make the log lines inside the block carry this claim's token, worker and attempts."""
    previous = _claim.set(ClaimContext(str(token), worker, attempts))
    try:
        yield
    finally:
        _claim.reset(previous)


class ReminderFields(logging.Filter):
    """Add the current claim's fields to a record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _claim.get()
        if context is None:
            return True
        record.claim_token = context.token
        record.worker = context.worker
        # The engine's lines name the reminder by id and key (``extra``); the claim adds the rest.
        attempt = context.attempts.get(getattr(record, "reminder_id", None))
        if attempt is not None:
            record.attempt = attempt
        return True
