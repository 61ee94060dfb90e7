"""The scheduler celery-beat runs (CELERY_BEAT_SCHEDULER): django-celery-beat's, in step.

``ScanScheduler`` is the stock DatabaseScheduler with one change: before its
first read of the schedule table, it makes the stored scan follow
REMINDERS_SCAN_INTERVAL (reminders.schedule.ensure_scan_schedule).

Why before, and not on Celery's ``beat_init`` signal: beat builds its
scheduler, which reads the table, before it sends ``beat_init``. A change
written after that first read is seen only through django-celery-beat's change
marker, and its first check after the read only takes a baseline. When two
beats start together, one can read the old interval, then take as its baseline
the other's change, and keep the old interval until its forced full reload
(five minutes later). Writing first, then reading, leaves no such window
(tests/reminders/test_schedule.py, tests/integration/test_delivery.py's two
beats).
"""

from __future__ import annotations

from django_celery_beat.schedulers import DatabaseScheduler

from reminders.schedule import ensure_scan_schedule


class ScanScheduler(DatabaseScheduler):
    """DatabaseScheduler that syncs the scan's row to the settings, then reads the table."""

    def setup_schedule(self) -> None:
        ensure_scan_schedule()
        super().setup_schedule()
