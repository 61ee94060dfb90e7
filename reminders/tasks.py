"""Celery entry points: thin wrappers that check their arguments, call one job, return counts.

The scan has no task: each worker's scan lane consumes its queue (reminders/worker/scanlane.py).
"""

from __future__ import annotations

import logging
import uuid

from celery import current_task, shared_task
from django.conf import settings
from django.db import InternalError, OperationalError

from reminders import queue
from reminders.models import MAX_ID, StaffDecision
from reminders.services.replay import replay_step
from reminders.worker import notices, pipeline, shutdown
from reminders.worker.testsend import reminder_send_test_run

logger = logging.getLogger(__name__)

# Retries of a batch whose claim could not reach the database (1, 2, 4, 8, 16 s).
DATABASE_RETRIES = 5


def parse_ids(value: object) -> list[int] | None:
    """Return the ids in ``value`` (ints from 1 to MAX_ID), or None when it is malformed."""
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

    ``held_by`` (``[claim token hex, [ids]]``) comes with a retry after the database went away
    inside a claim: that claim is released first.
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
        # Nothing was sent: retry shortly rather than drain the queue into errors while
        # PostgreSQL restarts. After the last retry the scan dispatches them again.
        cause = exc.__cause__
        if self.request.retries >= DATABASE_RETRIES:
            logger.error(
                "Database still unavailable (%s); %s reminders left to the scan",
                cause,
                len(exc.ids),
            )
            return {"database_unavailable": len(exc.ids)}
        logger.warning("Database unavailable (%s); retrying %s reminders", cause, len(exc.ids))
        held_by = [exc.held[0].hex, exc.held[1]] if exc.held else None
        raise self.retry(
            args=[exc.ids],
            kwargs={"held_by": held_by},
            countdown=2**self.request.retries,
        ) from exc
    logger.info("Batch of %s finished: %s", len(ids), counts)
    return counts


# Safe to rerun (guarded claims, StaffDecision rows): a brief database outage is waited out, and
# so is a failover's standby refusing writes (25006, an InternalError) until it is promoted.
RETRIED_ON_DATABASE_ERRORS = {
    "ignore_result": True,
    "autoretry_for": (OperationalError, InternalError),
    "retry_backoff": True,
    "max_retries": DATABASE_RETRIES,
}


@shared_task(name="reminders.deliver_notices", **RETRIED_ON_DATABASE_ERRORS)
def deliver_notices(notice_ids) -> dict[str, int]:
    """Deliver the change notices named by id; guarded claims make a retry take only what is
    pending."""
    ids = parse_ids(notice_ids)
    if ids is None:
        logger.error("Rejected deliver_notices with malformed ids %.200r", notice_ids)
        return {"rejected": 1}
    return notices.deliver_notices(
        ids, worker=current_task.request.hostname or "", stop=shutdown.flag()
    )


def _well_formed(decision_id, task: str) -> bool:
    """Return whether ``decision_id`` can name a StaffDecision; log the task's refusal if not."""
    if isinstance(decision_id, int) and not isinstance(decision_id, bool) and decision_id >= 1:
        return True
    logger.error("Rejected %s with a malformed id %.100r", task, decision_id)
    return False


@shared_task(name="reminders.replay_selection", **RETRIED_ON_DATABASE_ERRORS)
def replay_selection(decision_id) -> dict[str, int]:
    """Replay the next chunk of a background replay and queue the next (the scan resumes one
    left without a task)."""
    if not _well_formed(decision_id, "replay_selection"):
        return {"rejected": 1}
    decision = replay_step(decision_id=decision_id)
    if decision.state == StaffDecision.State.RUNNING:
        queue.publish_replay(decision.pk)
        return {"progress": decision.progress}
    logger.info(
        "Background replay %s done: %s of %s re-armed, %s queued",
        decision.pk,
        decision.changed,
        decision.selected,
        decision.queued,
    )
    return {"changed": decision.changed, "queued": decision.queued}


@shared_task(name="reminders.send_test", **RETRIED_ON_DATABASE_ERRORS)
def send_test(decision_id) -> dict[str, int]:
    """Send the test StaffDecision ``decision_id`` asks for (reminders.services.testsend)."""
    if not _well_formed(decision_id, "send_test"):
        return {"rejected": 1}
    decision = reminder_send_test_run(decision_id=decision_id)
    return {"sent": decision.changed}
