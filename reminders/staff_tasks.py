"""Celery entry point of staff work too large for a web request (CELERY_IMPORTS).

Kept apart from reminders.tasks, the send path, which never imports the
staff modules (the import contracts in .importlinter).
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError

from reminders.replay import replay_continue

logger = logging.getLogger(__name__)


@shared_task(
    name="reminders.replay_selection",
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def replay_selection(decision_id) -> dict[str, int]:
    """Work a background replay (StaffDecision ``decision_id``) through to its end.

    Safe to run twice or after a crash: each chunk commits with its progress.
    """
    if not isinstance(decision_id, int) or isinstance(decision_id, bool) or decision_id < 1:
        logger.error("Rejected replay_selection with a malformed id %.100r", decision_id)
        return {"rejected": 1}
    decision = replay_continue(decision_id=decision_id)
    logger.info(
        "Background replay %s done: %s of %s re-armed, %s queued",
        decision.pk,
        decision.changed,
        decision.selected,
        decision.queued,
    )
    return {"changed": decision.changed, "queued": decision.queued}


@shared_task(
    name="reminders.send_test",
    ignore_result=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def send_test(decision_id) -> dict[str, int]:
    """Send the test reminder StaffDecision ``decision_id`` asks for (reminders.testsend)."""
    from reminders.testsend import reminder_send_test_run

    if not isinstance(decision_id, int) or isinstance(decision_id, bool) or decision_id < 1:
        logger.error("Rejected send_test with a malformed id %.100r", decision_id)
        return {"rejected": 1}
    decision = reminder_send_test_run(decision_id=decision_id)
    return {"sent": decision.changed}
