"""Flower, started as docker-compose starts it, sees a real worker's delivery batches.

The workers send Celery task events with no extra setting (REMINDERS_TASK_EVENTS
is on by default), and Flower answers only with the basic-auth credentials it
was given.
"""

import os

import httpx
import pytest
import redis

from clock import SystemClock
from config.celery import app
from reminders.models import Reminder
from tests.support.processes import (
    CELERY,
    Proc,
    celery_worker,
    process_env,
    serving_on_a_new_port,
)
from tests.support.seeding import unplanned_workshop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

AUTH = ("ops", "not-a-real-password")
_clock = SystemClock()


def _tasks(base: str) -> dict:
    answer = httpx.get(f"{base}/api/tasks", auth=AUTH, timeout=5)
    answer.raise_for_status()
    return answer.json()


def _wait(predicate, *, timeout: float, what: str):
    deadline = _clock.monotonic() + timeout
    while _clock.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        _clock.sleep_blocking(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _flower_up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthcheck", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_flower_shows_the_workers_delivery_batches_and_asks_for_its_password(redis_url, smtp_sink):
    redis.Redis.from_url(redis_url).flushdb()
    workshop = unplanned_workshop("Flower test")
    env = process_env(
        REMINDERS_CHANNEL="smtp", EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(smtp_sink.port)
    )
    # The command and the only variables docker-compose.yml gives Flower: no project
    # code, no SECRET_KEY, no database.
    flower_env = {
        "PATH": os.environ["PATH"],
        "CELERY_BROKER_URL": env["CELERY_BROKER_URL"],
        "FLOWER_BASIC_AUTH": ":".join(AUTH),
    }

    def start(port: int) -> Proc:
        argv = [CELERY, "flower", "--address=127.0.0.1", f"--port={port}"]
        return Proc(argv, flower_env, "flower")

    def listening(_, port: int) -> bool:
        return _flower_up(f"http://127.0.0.1:{port}")

    # Flower binds the port itself; one taken meanwhile makes it exit, and another is tried.
    with serving_on_a_new_port(start, listening=listening) as (_, port):
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/api/tasks", timeout=5).status_code == 401
        assert httpx.get(f"{base}/api/tasks", auth=("ops", "wrong"), timeout=5).status_code == 401
        with celery_worker(env, name="flowered") as worker:
            app.send_task("reminders.scan")
            worker.wait_for_line("Batch of 3 finished")
            done = _wait(
                lambda: [
                    task
                    for task in _tasks(base).values()
                    if task["name"] == "reminders.deliver_batch" and task["state"] == "SUCCESS"
                ],
                timeout=30,
                what="a succeeded reminders.deliver_batch in Flower",
            )
        assert len(done) == 1
        assert done[0]["worker"].startswith("flowered@")
        assert Reminder.objects.filter(workshop=workshop, status="sent").count() == 3
