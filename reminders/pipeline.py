"""Compose the services into the scan that beat runs."""

from __future__ import annotations

import logging

from clock import Clock, default_clock
from reminders.services import reminders_plan

logger = logging.getLogger(__name__)


def scan(*, clock: Clock | None = None) -> dict[str, int]:
    """Plan missing reminders; return counts for the log."""
    clock = clock or default_clock()
    counts = {"planned": reminders_plan(clock=clock)}
    logger.info("Scan finished: %s", counts)
    return counts
