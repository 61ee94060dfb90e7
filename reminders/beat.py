"""The scheduler celery-beat runs (CELERY_BEAT_SCHEDULER).

It syncs the scan's row before its first read, not on ``beat_init`` (sent after that read):
else one of two beats starting together may miss the other's change until a full reload.
"""

from __future__ import annotations

from django_celery_beat.schedulers import DatabaseScheduler

from reminders.schedule import ensure_scan_schedule


class ScanScheduler(DatabaseScheduler):
    """DatabaseScheduler that syncs the scan's row to the settings, then reads the table."""

    def setup_schedule(self) -> None:
        ensure_scan_schedule()
        super().setup_schedule()
