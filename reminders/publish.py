"""Publish delivery batches to the broker, never hanging on a dead one.

Called from ``transaction.on_commit`` only, so a rolled-back transaction
publishes nothing (S3). A publish that fails (Redis down, B1) is logged and
the reminders are made due again for the next scan: nothing is lost and the
request or scan that published returns promptly.

The message names its task (``DELIVER_TASK``) instead of importing the task
module, so the services that dispatch never depend on the Celery entry points
that call them (an import contract keeps it so).
"""

from __future__ import annotations

import logging
from datetime import datetime

from kombu.exceptions import OperationalError

from config.celery import app
from reminders.services import reminders_unpublished

logger = logging.getLogger(__name__)

DELIVER_TASK = "reminders.deliver_batch"
REPLAY_TASK = "reminders.replay_selection"


def publish_batch(ids: list[int], expires_at: datetime) -> bool:
    """Send one ``reminders.deliver_batch`` message for ``ids``; return whether it went out.

    No Celery ``expires``: a worker would compare it with its own host's
    clock, and one running two minutes fast would drop messages whose
    reminders still had time. ``expires_at`` stays in the database
    (``queued_until``): past it the scan queues the rows again, and a message
    that runs late anyway claims only what the claim, by the database's clock,
    still allows.
    """
    try:
        app.send_task(DELIVER_TASK, args=[ids])
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(
            "Could not publish a batch of %s reminders (%s); the next scan queues them again",
            len(ids),
            exc,
        )
        reminders_unpublished(ids=ids)
        return False
    return True


def publish_replay(decision_id: int) -> bool:
    """Send one ``reminders.replay_selection`` message for a background replay.

    A failed publish loses nothing: the decision stays ``running`` without a
    heartbeat, and the scan hands it to a worker again
    (reminders.services.dispatch.replays_resume).
    """
    try:
        app.send_task(REPLAY_TASK, args=[decision_id])
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(
            "Could not publish background replay %s (%s); the scan resumes it", decision_id, exc
        )
        return False
    return True
