"""Every enqueue of the project, by task name, so no caller imports a task module.

Callers publish from ``transaction.on_commit`` (S3). A publish that fails
(B1) is logged and reported, never raised into a scan or a request.
"""

from __future__ import annotations

import logging

from celery import current_app
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)

DELIVER_TASK = "reminders.deliver_batch"
REPLAY_TASK = "reminders.replay_selection"
TEST_TASK = "reminders.send_test"
NOTICES_TASK = "reminders.deliver_notices"


def publish_batch(ids: list[int]) -> bool:
    """Send one ``reminders.deliver_batch`` message; return whether it went out.

    No Celery ``expires``: a worker would judge it by its own host's clock; when
    the message stops counting is the database's business (``queued_until``).
    """
    try:
        current_app.send_task(DELIVER_TASK, args=[ids])
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(
            "Could not publish a batch of %s reminders (%s); the next scan queues them again",
            len(ids),
            exc,
        )
        return False
    return True


def publish_notices(ids: list[int]) -> bool:
    """Send one ``reminders.deliver_notices`` message; return whether it went out.

    A failed publish loses nothing: the notices stay pending and the next scan
    publishes them again.
    """
    try:
        current_app.send_task(NOTICES_TASK, args=[ids])
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(
            "Could not publish %s change notices (%s); the next scan publishes them again",
            len(ids),
            exc,
        )
        return False
    return True


def publish_replay(decision_id: int) -> bool:
    """Send one ``reminders.replay_selection`` message for a background replay.

    A failed publish loses nothing: the decision stays ``running`` without a
    heartbeat, and the scan hands it to a worker again
    (reminders.services.dispatch.replays_resume).
    """
    try:
        current_app.send_task(REPLAY_TASK, args=[decision_id])
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(
            "Could not publish background replay %s (%s); the scan resumes it", decision_id, exc
        )
        return False
    return True


def publish_test(decision_id: int) -> None:
    """Send one ``reminders.send_test`` message; a failure reaches the staff member's request."""
    current_app.send_task(TEST_TASK, args=[decision_id])
