"""Run one scan now, the same job beat runs every REMINDERS_SCAN_INTERVAL seconds."""

from django.core.management.base import BaseCommand

from reminders.worker import pipeline


class Command(BaseCommand):
    help = (
        "Run one scan now (expire, reap, plan, dispatch) in this process; delivery is queued "
        "for the workers. Safe to run while beat runs: the scan is idempotent."
    )

    def handle(self, *args, **options):
        counts = pipeline.scan()
        self.stdout.write(", ".join(f"{name} {count}" for name, count in counts.items()))
