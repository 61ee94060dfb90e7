"""Pool processes forked while the scan lane's thread runs scans come up sound.

Celery's main process replaces a pool process after each task here
(``--max-tasks-per-child=1``), so it forks twenty times while its scan lane,
a thread of that same process, is kept busy by scan messages published every
tenth of a second. A child forked while that thread held a lock (logging, a
socket, a connection) would hang or fail its batch; every batch must finish
and every reminder be sent once.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from clock import SystemClock
from config.celery import app
from reminders.models import Reminder
from reminders.schedule import SCAN_QUEUE, SCAN_TASK
from reminders.worker import pipeline
from tests.support.processes import celery_worker, process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

_real = SystemClock()


def test_pool_processes_forked_while_scans_run_deliver_every_batch_once(
    live_clock, broker, smtp_sink, make_workshop, enrol, settings
):
    settings.REMINDERS_BATCH_SIZE = 2
    enrol(make_workshop(), count=40)
    env = process_env(
        REMINDERS_CHANNEL="smtp",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp_sink.port),
        REMINDERS_BATCH_SIZE="2",
    )
    stop = threading.Event()

    def keep_the_lane_busy() -> None:
        while not stop.wait(0.1):
            app.send_task(SCAN_TASK, queue=SCAN_QUEUE)

    with celery_worker(env, concurrency=2, extra=("--max-tasks-per-child=1",)) as worker:
        publisher = threading.Thread(target=keep_the_lane_busy)
        publisher.start()
        try:
            assert pipeline.scan(clock=live_clock)["dispatched"] == 40
            give_up = _real.monotonic() + 120
            while Reminder.objects.exclude(status="sent").exists():
                assert _real.monotonic() < give_up, "batches did not finish (a child hung?)"
                _real.sleep_blocking(0.2)
        finally:
            stop.set()
            publisher.join(10)
        lines = list(worker.lines)
    scans = sum("Scan finished" in line for line in lines)
    batches = sum("Batch of 2 finished" in line for line in lines)
    per_recipient = Counter(r.lower() for m in smtp_sink.received() for r in m.rcpt_tos)
    print(f"\nforks under scans: {batches} batches, {scans} scans while they ran")
    assert batches == 20 and scans >= 5, "the lane was not running scans during the forks"
    assert len(per_recipient) == 40 and set(per_recipient.values()) == {1}
    assert not [line for line in lines if "Traceback" in line or "WorkerLostError" in line]
