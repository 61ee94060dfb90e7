"""The scan lane drops piled-up scans by counting the queue, never by a clock."""

from __future__ import annotations

import pytest
import redis

from clock import SystemClock
from config.celery import app
from reminders.schedule import SCAN_QUEUE, SCAN_TASK
from reminders.worker import scanlane


@pytest.fixture
def scan_queue(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.delete(SCAN_QUEUE)
    yield client
    client.delete(SCAN_QUEUE)


def test_of_scans_piled_up_only_the_newest_runs_whatever_their_expiry_says(scan_queue):
    """Three scans waited while the workers were down; one carries an expiry long past by
    any clock (beat's host two minutes slow, say). The lane runs the newest only."""
    sent = [
        app.send_task(SCAN_TASK, queue=SCAN_QUEUE, expires=expires)
        for expires in (None, None, "2000-01-01T00:00:00+00:00")
    ]
    assert scan_queue.llen(SCAN_QUEUE) == len(sent)
    ran: list[str] = []
    lane = scanlane.ScanLane(app)
    lane._scan = lambda: ran.append("scan")  # counted instead of run
    lane.start()
    give_up = SystemClock().monotonic() + 20
    while scan_queue.llen(SCAN_QUEUE) or len(ran) < 1:
        assert SystemClock().monotonic() < give_up, "the lane did not take the scans"
        SystemClock().sleep_blocking(0.05)
    lane.stop()
    lane.join(10)
    assert ran == ["scan"]
