"""The scan's schedule: one interval task in django-celery-beat's table."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError

SCAN_TASK_NAME = "Scan for workshops starting soon"
SCAN_TASK = "reminders.scan"
SCAN_QUEUE = "scan"
# The ScanRun row every completed scan counts itself in.
SCAN_NAME = "scan"


def ensure_scan_schedule(*, interval_model=None, task_model=None, every: int | None = None):
    """Create or update the periodic scan so it follows REMINDERS_SCAN_INTERVAL; return it.

    Run by the data migration and at every beat start. Two beats may both create the interval
    (no unique key): any one serves; of two creating the task, one does and the other reads it.
    """
    if interval_model is None or task_model is None:
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        interval_model = interval_model or IntervalSchedule
        task_model = task_model or PeriodicTask
    every = every or settings.REMINDERS_SCAN_INTERVAL
    same = interval_model.objects.filter(every=every, period="seconds")
    interval = same.order_by("pk").first() or same.create(every=every, period="seconds")
    wanted = {
        "task": SCAN_TASK,
        "interval_id": interval.pk,
        "queue": SCAN_QUEUE,
        # No expiry (a host's clock): the scan lane drops a scan with a newer one behind.
        "expire_seconds": None,
        "enabled": True,
    }
    try:
        task, created = task_model.objects.get_or_create(
            name=SCAN_TASK_NAME,
            defaults={
                **wanted,
                "args": "[]",
                "kwargs": "{}",
                "description": "Plan, dispatch, reconcile and reap reminders "
                "(REMINDERS_SCAN_INTERVAL).",
            },
        )
    except (ValidationError, IntegrityError):
        # Another beat starting at the same moment created it first (PeriodicTask.save()
        # checks the name itself, so get_or_create does not see it as its race).
        task, created = task_model.objects.get(name=SCAN_TASK_NAME), False
    if not created and any(getattr(task, field) != value for field, value in wanted.items()):
        for field, value in wanted.items():
            setattr(task, field, value)
        task.crontab = None
        task.save()
    return task
