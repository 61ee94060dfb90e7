"""Item 11: scans keep completing while every delivery process is busy.

A real worker started as operators start it (``celery -A config worker``,
no -Q), one pool process, a real beat scanning every 5 s, and a backlog of
SMTP batches that keeps the pool process busy for more than three intervals.
The scan runs in the worker's own lane (reminders/worker/scanlane.py) and records
each completion (ScanRun); the gaps between completions stay within two
intervals. Before the lane, the scan waited behind the batches, expired
after 4 s and never ran while the backlog lasted.
"""

from __future__ import annotations

import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from clock import SystemClock
from reminders.models import Reminder, ScanRun
from reminders.worker import pipeline
from tests.support.processes import Proc, celery_worker, process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]

_real = SystemClock()
INTERVAL = 5
BACKLOG_INTERVALS = 3


def test_scans_complete_every_two_intervals_while_the_pool_is_busy(
    live_clock, broker, smtp_sink, make_workshop, enrol, tmp_path
):
    enrol(make_workshop(starts_in=timedelta(hours=3)), count=40)
    smtp_sink.data_delay = 1.0  # one connection, one message a second: 40 s of delivery
    env = process_env(
        REMINDERS_CHANNEL="smtp",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp_sink.port),
        REMINDERS_SMTP_CONNECTIONS="1",
        REMINDERS_BATCH_SIZE="10",
        REMINDERS_SCAN_INTERVAL=str(INTERVAL),
    )
    celery = str(Path(sys.executable).with_name("celery"))
    completions: list = []
    with celery_worker(env, concurrency=1):
        pipeline.scan(clock=live_clock)  # queue the backlog: four 10-second batches
        # The gaps are between scans beat asked for; the test's own scan above is
        # not one (the first gap would then measure beat's start-up, not the lane).
        own_scan = ScanRun.objects.get(name="scan").finished_at
        beat = Proc(
            [celery, "-A", "config", "beat", "--loglevel=INFO",
             f"--pidfile={tmp_path}/beat.pid", f"--schedule={tmp_path}/beat.db"],
            env,
            "beat",
        )  # fmt: skip
        try:
            beat.wait_ready()
            began = _real.monotonic()
            while _real.monotonic() - began < BACKLOG_INTERVALS * INTERVAL + 2:
                run = ScanRun.objects.filter(name="scan").values_list("finished_at", flat=True)
                finished = next(iter(run), None)
                if finished not in (None, own_scan) and (
                    not completions or completions[-1] != finished
                ):
                    completions.append(finished)
                assert Reminder.objects.filter(status="sending").exists() or (
                    Reminder.objects.filter(status="queued").exists()
                ), "the backlog ran out before the window ended; the test proves nothing"
                _real.sleep_blocking(0.2)
        finally:
            beat.stop()
    gaps = [(b - a).total_seconds() for a, b in zip(completions, completions[1:], strict=False)]
    busy = Counter(Reminder.objects.values_list("status", flat=True))
    print(f"\nscan lane: {len(completions)} scans completed, gaps {gaps}; statuses {dict(busy)}")
    assert len(completions) >= BACKLOG_INTERVALS - 1
    assert max(gaps) <= 2 * INTERVAL
