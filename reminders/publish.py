"""Publish delivery batches to the broker, never hanging on a dead one.

Called from ``transaction.on_commit`` only, so a rolled-back transaction
publishes nothing (S3). A publish that fails (Redis down, B1) is logged and
the reminders are made due again for the next scan: nothing is lost and the
request or scan that published returns promptly.
"""

from __future__ import annotations

import logging
from datetime import datetime

from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)


def publish_batch(ids: list[int], expires_at: datetime) -> bool:
    """Send one ``reminders.deliver_batch`` message for ``ids``; return whether it went out."""
    from reminders.services import reminders_unpublished
    from reminders.tasks import deliver_batch

    try:
        deliver_batch.apply_async(args=[ids], expires=expires_at)
    except (OperationalError, ConnectionError, OSError, TimeoutError) as exc:
        logger.error(
            "Could not publish a batch of %s reminders (%s); the next scan queues them again",
            len(ids),
            exc,
        )
        reminders_unpublished(ids=ids)
        return False
    return True
