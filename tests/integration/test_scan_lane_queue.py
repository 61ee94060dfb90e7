"""The scan lane runs only the newest of the scans waiting in its queue (scanlane.py)."""

from __future__ import annotations

import logging

import pytest
import redis

from clock import SystemClock
from reminders.models import ScanRun
from reminders.schedule import SCAN_QUEUE, SCAN_TASK
from reminders.worker.scanlane import ScanLane

pytestmark = pytest.mark.django_db(transaction=True)

_real = SystemClock()


def test_a_scan_with_newer_ones_waiting_behind_it_is_dropped(broker):
    """Three scans published while no lane ran (a worker restarting): the lane runs one,
    not three back to back, and takes every message off the queue."""
    from config.celery import app

    for _ in range(3):
        app.send_task(SCAN_TASK, queue=SCAN_QUEUE)
    waiting = redis.Redis.from_url(broker)
    assert waiting.llen(SCAN_QUEUE) == 3
    lane = ScanLane(app, hostname="lane-test")
    lane.start()
    give_up = _real.monotonic() + 20
    while _real.monotonic() < give_up and not (
        waiting.llen(SCAN_QUEUE) == 0 and ScanRun.objects.filter(name="scan").exists()
    ):
        _real.sleep_blocking(0.05)
    lane.stop()
    lane.join(30)
    assert waiting.llen(SCAN_QUEUE) == 0
    assert ScanRun.objects.get(name="scan").completed == 1


def test_a_message_for_another_task_on_the_scan_queue_is_dropped_not_run(broker, caplog):
    """Only scans run on the lane; anything else routed to its queue is logged and removed."""
    from config.celery import app

    app.send_task("reminders.deliver_batch", args=[[1]], queue=SCAN_QUEUE)
    waiting = redis.Redis.from_url(broker)
    lane = ScanLane(app)
    lane.start()
    give_up = _real.monotonic() + 20
    while _real.monotonic() < give_up and waiting.llen(SCAN_QUEUE):
        _real.sleep_blocking(0.05)
    lane.stop()
    lane.join(30)
    assert waiting.llen(SCAN_QUEUE) == 0
    assert not ScanRun.objects.exists()
    assert "Scan lane dropped a 'reminders.deliver_batch' message" in caplog.text


def test_a_scan_with_none_behind_it_runs_with_no_warning(broker, caplog):
    """The usual case, a scan a minute and none waiting behind it: Redis keeps no empty
    list, so the queue the lane looks at is not found, which means none waits; the lane
    logs nothing at WARNING for it (an operator would see one a minute, saying nothing)."""
    from config.celery import app

    caplog.set_level("INFO", logger="reminders.worker.scanlane")
    app.send_task(SCAN_TASK, queue=SCAN_QUEUE)
    lane = ScanLane(app, hostname="lane-test")
    lane.start()
    give_up = _real.monotonic() + 20
    while _real.monotonic() < give_up and not ScanRun.objects.filter(name="scan").exists():
        _real.sleep_blocking(0.05)
    lane.stop()
    lane.join(30)
    assert ScanRun.objects.get(name="scan").completed == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == []
