"""Celery entry points: thin wrappers that take ids, call one pipeline job, return counts.

Settings that shape their runtime (acks late, prefetch 1, time limits above
the batch budget, no requeue of a lost worker's message) are in
config/settings.py, each with its reason.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from reminders import pipeline, shutdown

logger = logging.getLogger(__name__)

# Retries of a batch whose claim could not reach the database (1, 2, 4, 8, 16 s).
DATABASE_RETRIES = 5


@shared_task(name="reminders.scan", ignore_result=True)
def scan() -> dict[str, int]:
    """Run one scan: expire, reap, plan and dispatch (owned by celery-beat)."""
    return pipeline.scan()


# The largest primary key the database can hold (BigAutoField: a signed 64-bit
# integer on PostgreSQL and SQLite). A larger id names no reminder that can exist.
MAX_ID = 2**63 - 1


def parse_ids(value: object) -> list[int] | None:
    """Return the list of ids in ``value`` (ints from 1 to MAX_ID), or None when it is malformed."""
    if not isinstance(value, list) or not value or len(value) > settings.REMINDERS_BATCH_SIZE * 10:
        return None
    if not all(
        isinstance(item, int) and not isinstance(item, bool) and 0 < item <= MAX_ID
        for item in value
    ):
        return None
    return list(dict.fromkeys(value))


@shared_task(
    name="reminders.deliver_batch", bind=True, ignore_result=True, max_retries=DATABASE_RETRIES
)
def deliver_batch(self, reminder_ids) -> dict[str, int]:
    """Deliver the reminders named by id; malformed arguments are rejected, never retried."""
    ids = parse_ids(reminder_ids)
    if ids is None:
        logger.error("Rejected deliver_batch with malformed ids %.200r", reminder_ids)
        return {"rejected": 1}
    try:
        counts = pipeline.deliver(ids, worker=self.request.hostname or "", stop=shutdown.flag())
    except pipeline.DatabaseUnavailable as exc:
        # Nothing was claimed: try again shortly instead of letting the queue
        # drain into errors while PostgreSQL restarts. After the last retry the
        # reminders stay queued and the scan dispatches them again.
        if self.request.retries >= DATABASE_RETRIES:
            logger.error("Database still unavailable; %s reminders left to the scan", len(exc.ids))
            return {"database_unavailable": len(exc.ids)}
        logger.warning("Database unavailable; retrying %s reminders", len(exc.ids))
        raise self.retry(
            args=[exc.ids], countdown=2**self.request.retries, max_retries=DATABASE_RETRIES
        ) from exc
    logger.info("Batch of %s finished: %s", len(ids), counts)
    return counts
