"""Every enqueue of the project, by task name, so no caller imports a task module.

Callers publish from ``transaction.on_commit`` (S3); a failed publish (B1) is logged and
reported, never raised into a scan or a request.
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


def _send(task: str, args: list, *, failed: str) -> bool:
    """Send one message; on a broker failure log ``failed`` (with the error) and return False."""
    try:
        current_app.send_task(task, args=args)
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(failed, exc)
        return False
    return True


def publish_batch(ids: list[int]) -> bool:
    """Send one ``reminders.deliver_batch`` message; return whether it went out.

    No Celery ``expires`` (a worker's clock would judge it): ``queued_until`` does.
    """
    return _send(
        DELIVER_TASK,
        [ids],
        failed=f"Could not publish a batch of {len(ids)} reminders (%s); the next scan "
        "queues them again",
    )


def publish_notices(ids: list[int]) -> bool:
    """Send one ``reminders.deliver_notices`` message; return whether it went out."""
    return _send(
        NOTICES_TASK,
        [ids],
        failed=f"Could not publish {len(ids)} change notices (%s); the next scan publishes "
        "them again",
    )


def publish_replay(decision_id: int) -> bool:
    """Send one ``reminders.replay_selection`` message (on failure the scan resumes the replay)."""
    return _send(
        REPLAY_TASK,
        [decision_id],
        failed=f"Could not publish background replay {decision_id} (%s); the scan resumes it",
    )


def publish_test(decision_id: int) -> bool:
    """Send one ``reminders.send_test`` message; return whether it went out."""
    return _send(TEST_TASK, [decision_id], failed=f"Could not publish test send {decision_id} (%s)")
