"""Celery entry points: thin wrappers that take ids, call one pipeline job, return counts.

Settings that shape their runtime (acks late, prefetch 1, time limits above
the batch budget, no requeue of a lost worker's message) are in
config/settings.py, each with its reason.
"""

from __future__ import annotations

import logging
import uuid

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


def _parse_held(value: object, ids: list[int]) -> tuple[uuid.UUID, list[int]] | None:
    """Return ``held_by`` as (token, ids among ``ids``), or None when absent or malformed."""
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str):
        return None
    chunk = parse_ids(value[1])
    try:
        token = uuid.UUID(hex=value[0])
    except ValueError:
        return None
    if chunk is None or not set(chunk) <= set(ids):
        return None
    return token, chunk


@shared_task(
    name="reminders.deliver_batch", bind=True, ignore_result=True, max_retries=DATABASE_RETRIES
)
def deliver_batch(self, reminder_ids, held_by=None) -> dict[str, int]:
    """Deliver the reminders named by id; malformed arguments are rejected, never retried.

    ``held_by`` (``[claim token hex, [ids]]``) comes only with a retry after the
    database went away inside a claim: that claim is released first.
    """
    ids = parse_ids(reminder_ids)
    if ids is None:
        logger.error("Rejected deliver_batch with malformed ids %.200r", reminder_ids)
        return {"rejected": 1}
    held = _parse_held(held_by, ids)
    if held_by is not None and held is None:
        # The ids are still delivered; rows that claim may hold wait for their lease.
        logger.error("Ignored a malformed held_by %.200r of deliver_batch", held_by)
    try:
        counts = pipeline.deliver(
            ids, worker=self.request.hostname or "", stop=shutdown.flag(), held=held
        )
    except pipeline.DatabaseUnavailable as exc:
        # Nothing was sent; the claim the database went away in may hold some
        # (exc.held), and the retry releases it first. Try again shortly instead
        # of letting the queue drain into errors while PostgreSQL restarts. After
        # the last retry the reminders stay queued (any that claim holds wait for
        # their lease) and the scan dispatches them again.
        if self.request.retries >= DATABASE_RETRIES:
            logger.error("Database still unavailable; %s reminders left to the scan", len(exc.ids))
            return {"database_unavailable": len(exc.ids)}
        logger.warning("Database unavailable; retrying %s reminders", len(exc.ids))
        held_by = [exc.held[0].hex, exc.held[1]] if exc.held else None
        raise self.retry(
            args=[exc.ids],
            kwargs={"held_by": held_by},
            countdown=2**self.request.retries,
            max_retries=DATABASE_RETRIES,
        ) from exc
    logger.info("Batch of %s finished: %s", len(ids), counts)
    return counts
