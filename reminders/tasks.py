"""Celery entry points: thin wrappers that take ids, call one service, return counts."""

from __future__ import annotations

import logging

from celery import shared_task

from reminders import pipeline

logger = logging.getLogger(__name__)


@shared_task(name="reminders.scan", ignore_result=True)
def scan() -> dict[str, int]:
    """Run one scan: expire, reap, plan and dispatch (owned by celery-beat)."""
    return pipeline.scan()
