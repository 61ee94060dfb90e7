"""A real Celery worker process on the real Redis runs a task this test enqueued."""

from datetime import timedelta

import pytest
import redis

from clock import SystemClock
from config.celery import app
from reminders.models import Reminder
from tests.support.processes import celery_worker, process_env
from workshops.models import Attendee, Enrollment, Workshop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_worker_process_runs_the_scan_it_was_sent(redis_url, tmp_path):
    redis.Redis.from_url(redis_url).flushdb()
    now = SystemClock().now()
    workshop = Workshop.objects.create(
        title="Worker test",
        starts_at=now + timedelta(hours=2),
        ends_at=now + timedelta(hours=3),
        timezone="Europe/Berlin",
    )
    people = Attendee.objects.bulk_create(
        Attendee(name=f"P{i}", email=f"p{i}@example.com") for i in range(3)
    )
    # Created behind the services' back, so only the scan can plan them.
    Enrollment.objects.bulk_create(Enrollment(attendee=p, workshop=workshop) for p in people)
    assert Reminder.objects.count() == 0

    outbox = tmp_path / "outbox"
    env = process_env(REMINDERS_CHANNEL="file", REMINDERS_FILE_DIR=str(outbox))
    with celery_worker(env) as worker:
        app.send_task("reminders.scan")
        worker.wait_for_line("Scan finished")
        worker.wait_for_line("Batch of 3 finished")
    assert Reminder.objects.filter(workshop=workshop, status="sent").count() == 3
    assert len(list(outbox.glob("*.eml"))) == 3
