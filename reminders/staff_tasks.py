"""Celery entry point of staff work too large for a web request (CELERY_IMPORTS).

Kept apart from reminders.tasks, the send path, which never imports the
staff modules (the import contracts in .importlinter).
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError

from reminders.models import StaffDecision
from reminders.replay import replay_step
from reminders.testsend import reminder_send_test_run

logger = logging.getLogger(__name__)


# Both tasks take a StaffDecision id and are safe to run again: a database
# that is away for a moment is waited out.
STAFF_TASK = {
    "ignore_result": True,
    "autoretry_for": (OperationalError,),
    "retry_backoff": True,
    "max_retries": 5,
}


def _well_formed(decision_id, task: str) -> bool:
    """Return whether ``decision_id`` can name a StaffDecision; log the task's refusal if not."""
    if isinstance(decision_id, int) and not isinstance(decision_id, bool) and decision_id >= 1:
        return True
    logger.error("Rejected %s with a malformed id %.100r", task, decision_id)
    return False


@shared_task(name="reminders.replay_selection", **STAFF_TASK)
def replay_selection(decision_id) -> dict[str, int]:
    """Replay the next chunk of a background replay (StaffDecision ``decision_id``).

    Each chunk is a task of its own, which queues the next one when it has
    committed: a worker lost or a time limit costs at most the chunk under
    way, and a replay left without a task (that queueing lost) is handed to a
    worker again by the scan once its heartbeat is older than the claim
    lease. Safe to run twice or after a crash: each chunk commits with its
    progress.
    """
    if not _well_formed(decision_id, "replay_selection"):
        return {"rejected": 1}
    decision = replay_step(decision_id=decision_id)
    if decision.state == StaffDecision.State.RUNNING:
        replay_selection.delay(decision.pk)
        return {"progress": decision.progress}
    logger.info(
        "Background replay %s done: %s of %s re-armed, %s queued",
        decision.pk,
        decision.changed,
        decision.selected,
        decision.queued,
    )
    return {"changed": decision.changed, "queued": decision.queued}


@shared_task(name="reminders.send_test", **STAFF_TASK)
def send_test(decision_id) -> dict[str, int]:
    """Send the test reminder StaffDecision ``decision_id`` asks for (reminders.testsend)."""
    if not _well_formed(decision_id, "send_test"):
        return {"rejected": 1}
    decision = reminder_send_test_run(decision_id=decision_id)
    return {"sent": decision.changed}
