"""The beat-owned schedule of the scan: one interval task, kept in the database.

Only celery-beat (django-celery-beat's DatabaseScheduler) decides when a scan
runs. Workshops and reminders never see timers or polling: they are rows that
the scan reads.
"""

from __future__ import annotations

import json

from django.conf import settings

SCAN_TASK_NAME = "Scan for workshops starting soon"
SCAN_TASK = "reminders.scan"
SCAN_QUEUE = "scan"
# The ScanRun row every completed scan counts itself in.
SCAN_NAME = "scan"


def ensure_scan_schedule(*, interval_model=None, task_model=None, every: int | None = None):
    """Create or update the periodic scan so it follows REMINDERS_SCAN_INTERVAL.

    Idempotent: run by the data migration and at every beat start, before
    the scheduler's first read (reminders.beat.ScanScheduler), so changing the
    variable and restarting beat is enough. Safe for two beats starting at
    once: IntervalSchedule has no unique key, so two may both create the same
    interval; any one of them serves. Return the PeriodicTask.
    """
    if interval_model is None or task_model is None:
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        interval_model = interval_model or IntervalSchedule
        task_model = task_model or PeriodicTask
    every = every or settings.REMINDERS_SCAN_INTERVAL
    same = interval_model.objects.filter(every=every, period="seconds")
    interval = same.order_by("pk").first() or same.create(every=every, period="seconds")
    task, created = task_model.objects.get_or_create(
        name=SCAN_TASK_NAME,
        defaults={
            "task": SCAN_TASK,
            "interval": interval,
            "queue": SCAN_QUEUE,
            # No expiry: it would be judged by a host's clock. The scan lane drops
            # a scan that has a newer one behind it (reminders/worker/scanlane.py).
            "expire_seconds": None,
            "args": json.dumps([]),
            "kwargs": json.dumps({}),
            "enabled": True,
            "description": "Plan, dispatch, reconcile and reap reminders (REMINDERS_SCAN_INTERVAL).",
        },
    )
    if not created:
        wanted = {
            "task": SCAN_TASK,
            "interval_id": interval.pk,
            "queue": SCAN_QUEUE,
            "expire_seconds": None,
            "enabled": True,
        }
        if any(getattr(task, field) != value for field, value in wanted.items()):
            for field, value in wanted.items():
                setattr(task, field, value)
            task.crontab = None
            task.save()
    return task
