"""A real Celery worker process on the real Redis runs a task this test enqueued."""

import pytest
import redis

from config.celery import app
from reminders.models import Reminder
from tests.support.processes import celery_worker, process_env
from tests.support.seeding import unplanned_workshop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_worker_process_runs_the_scan_it_was_sent(redis_url, smtp_sink):
    redis.Redis.from_url(redis_url).flushdb()
    # Created behind the services' back, so only the scan can plan them.
    workshop = unplanned_workshop("Worker test")
    assert Reminder.objects.count() == 0

    env = process_env(
        REMINDERS_CHANNEL="smtp", EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(smtp_sink.port)
    )
    with celery_worker(env) as worker:
        app.send_task("reminders.scan")
        worker.wait_for_line("Scan finished")
        worker.wait_for_line("Batch of 3 finished")
    assert Reminder.objects.filter(workshop=workshop, status="sent").count() == 3
    # Counted at a server that records every message (files would overwrite by key).
    recipients = sorted(r for m in smtp_sink.received() for r in m.rcpt_tos)
    assert recipients == [f"p{i}@example.com" for i in range(3)]
