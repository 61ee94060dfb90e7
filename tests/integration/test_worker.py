"""A real Celery worker process on the real Redis runs a task this test enqueued."""

import pytest
import redis
from django.db import connection

from clock import SystemClock
from config.celery import app
from reminders.models import Reminder
from reminders.services import reminders_plan
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


def test_a_pool_process_keeps_its_database_session_from_batch_to_batch(redis_url, smtp_sink):
    """Two batches, one after the other, run in the same PostgreSQL session: Celery's fix-up
    no longer closes it after each task (the worker's hook applies CONN_MAX_AGE instead)."""
    env = _two_planned_reminders("Kept session", redis_url, smtp_sink)
    sessions = []
    since = _database_now()
    with celery_worker(env) as worker:
        for pk in Reminder.objects.order_by("pk").values_list("pk", flat=True):
            task = app.send_task("reminders.deliver_batch", args=[[pk]])
            # Logged by the main process once the pool process has run task_postrun.
            worker.wait_for_line(f"{task.id}] succeeded")
            sessions.append(_other_sessions(since))
    assert Reminder.objects.filter(status="sent").count() == 2
    assert len(sessions[0]) == 1 and sessions[0] == sessions[1], sessions


def _two_planned_reminders(title: str, redis_url: str, smtp_sink) -> dict:
    """Plan two reminders on an empty broker; return a worker's environment sending to the sink."""
    if connection.vendor != "postgresql":
        pytest.skip("a session is a PostgreSQL backend here")
    redis.Redis.from_url(redis_url).flushdb()
    unplanned_workshop(title, attendees=2)
    reminders_plan(clock=SystemClock())
    return process_env(
        REMINDERS_CHANNEL="smtp", EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(smtp_sink.port)
    )


def _database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _other_sessions(since) -> set[tuple]:
    """Sessions opened since ``since`` but this one: an earlier test's late-closing connection
    (a thread's, on a loaded host) is not the worker's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND backend_start >= %s",
            [since],
        )
        return set(cursor.fetchall())


def test_a_session_killed_between_batches_is_replaced_before_the_next_one(redis_url, smtp_sink):
    """The kept session dies while the pool process is idle (a PostgreSQL restart, a pooler
    dropping it): the next task's health check replaces it, so the batch runs at once rather
    than failing its first statement and waiting for a retry."""
    env = _two_planned_reminders("Killed session", redis_url, smtp_sink)
    first, second = Reminder.objects.order_by("pk").values_list("pk", flat=True)
    since = _database_now()
    with celery_worker(env) as worker:
        task = app.send_task("reminders.deliver_batch", args=[[first]])
        worker.wait_for_line(f"{task.id}] succeeded")
        [(pid, _)] = _other_sessions(since)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        task = app.send_task("reminders.deliver_batch", args=[[second]])
        worker.wait_for_line(f"{task.id}] succeeded")
        output = worker.output()
    assert Reminder.objects.filter(status="sent").count() == 2
    assert "Database unavailable" not in output, output
