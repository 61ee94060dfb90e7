"""A real worker's metrics port and the web's /metrics, scraped around a real delivery.

Five reminders go through a real Celery worker (two pool processes, batches
of two) to the loopback HTTP provider, which answers one with a 429, one
with a 503 and one with a 400 first. Each series must move by exactly what
happened: seven calls in all, four sends, and the rows' statuses.
"""

from __future__ import annotations

import socket
import subprocess

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from clock import SystemClock
from config.celery import app
from loopback.http_sink import HttpSink
from reminders.models import Reminder, reminder_key
from tests.support.processes import (
    CELERY,
    Proc,
    process_env,
    serving_on_a_new_port,
    worker_argv,
)
from tests.support.seeding import unplanned_workshop
from workshops.models import Enrollment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SECRET = "metrics-test-secret-0a1b2c3d4e5f6a7b"
TOKEN = "scrape-token"
_clock = SystemClock()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """Return every sample as {(name, sorted labels): value}."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _scrape_worker(port: int) -> dict[tuple[str, tuple], float]:
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    answer.raise_for_status()
    return _samples(answer.text)


def _listening_on(port: int) -> set[str]:
    """Return the IPv4 addresses a socket of this machine listens on at ``port``."""
    found = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def _wait(predicate, *, timeout: float, what: str):
    deadline = _clock.monotonic() + timeout
    while _clock.monotonic() < deadline:
        if predicate():
            return
        _clock.sleep_blocking(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def calls(samples, outcome: str) -> float:
    key = (("channel", "http"), ("kind", "reminder"), ("outcome", outcome))
    return samples[("reminders_provider_calls_total", key)]


def test_each_series_moves_by_what_a_real_delivery_did(redis_url, tmp_path, settings, client):
    redis.Redis.from_url(redis_url).flushdb()
    workshop = unplanned_workshop("Metrics test", attendees=5)
    attendees = Enrollment.objects.filter(workshop=workshop).order_by("pk")
    keys = [reminder_key(attendee_id=e.attendee_id, workshop_id=workshop.pk) for e in attendees]
    with HttpSink(secret=SECRET, delay=0.2) as sink:
        sink.script(keys[0], 429)
        sink.script(keys[1], 503)
        sink.script(keys[2], 400)
        env = process_env(
            REMINDERS_CHANNEL="http",
            REMINDERS_HTTP_URL=sink.url,
            REMINDERS_HTTP_SECRET=SECRET,
            REMINDERS_RATE_LIMIT="50",
            REMINDERS_BATCH_SIZE="2",
            REMINDERS_VAR_DIR=str(tmp_path),
        )

        def start(port: int) -> Proc:
            served = {**env, "REMINDERS_METRICS_PORT": str(port)}
            return Proc(worker_argv(concurrency=2, name="metered"), served, "metered")

        # A worker that finds its port taken exits (the test below): another port is tried.
        with serving_on_a_new_port(start, listening=lambda proc, _: proc.ready) as (worker, port):
            before = _scrape_worker(port)
            # REMINDERS_METRICS_BIND's default: this machine only, not every interface.
            assert _listening_on(port) == {"127.0.0.1"}
            app.send_task("reminders.scan")
            _wait(
                lambda: (
                    Reminder.objects.filter(
                        workshop=workshop, status__in=["sent", "failed"]
                    ).count()
                    == 5
                ),
                timeout=60,
                what="all five reminders to end",
            )
            worker.wait_for_line("Batch of 1 finished")
            after = _scrape_worker(port)
            files = sorted(path.name for path in (tmp_path / "metrics").glob("*/*.db"))

    # Before the first batch every outcome of the configured channel is there, at zero.
    assert [calls(before, o) for o in ("sent", "throttled", "transient", "permanent")] == [0] * 4
    # Seven calls: four accepted, and the 429, the 503 and the 400 before them.
    assert calls(after, "sent") == 4
    assert calls(after, "throttled") == 1
    assert calls(after, "transient") == 1
    assert calls(after, "permanent") == 1
    assert calls(after, "timeout") == calls(after, "maybe_delivered") == 0
    assert after[("reminders_provider_call_seconds_count", (("channel", "http"),))] == 7
    # Each call waited for the sink's 0.2 s answer.
    assert after[("reminders_provider_call_seconds_sum", (("channel", "http"),))] >= 7 * 0.2
    assert after[("reminders_limiter_wait_seconds_count", ())] == 7
    # The deadline is 30 minutes before a start 2 hours away: every send had about 90 minutes.
    slack = {labels: value for (name, labels), value in after.items()
             if name == "reminders_send_slack_seconds_bucket"}  # fmt: skip
    assert slack[(("channel", "http"), ("kind", "reminder"), ("le", "3600.0"))] == 0
    assert slack[(("channel", "http"), ("kind", "reminder"), ("le", "7200.0"))] == 4
    count = ("reminders_send_slack_seconds_count", (("channel", "http"), ("kind", "reminder")))
    assert after[count] == 4
    # The sum came from the files of more than one process: both pool processes sent.
    assert len(files) >= 3, files  # the main process's, and one per pool process that counted
    assert len(sink.requests) == 7

    settings.METRICS_TOKEN = TOKEN
    web = _samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    assert web[("reminders_by_status", (("status", "sent"),))] == 4
    assert web[("reminders_by_status", (("status", "failed"),))] == 1
    assert web[("reminders_by_status", (("status", "queued"),))] == 0
    assert web[("reminders_scans_total", ())] >= 1
    assert web[("reminders_scan_last_completed_timestamp_seconds", ())] > 0
    assert web[("reminders_queue_depth", (("queue", "reminders"),))] == 0


def test_a_worker_whose_metrics_port_is_taken_exits_and_says_what_to_do(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = process_env(REMINDERS_METRICS_PORT=str(port), REMINDERS_VAR_DIR=str(tmp_path))
        worker = Proc(
            [CELERY, "-A", "config", "worker", "--concurrency=1", "--hostname=clash@%h",
             "--without-mingle", "--without-gossip"],
            env,
            "clash",
        )  # fmt: skip
        try:
            code = worker.popen.wait(60)
        except subprocess.TimeoutExpired:
            worker.stop()
            raise AssertionError(f"the worker kept running:\n{worker.output()}") from None
        worker.stop()
    assert code != 0
    assert f"REMINDERS_METRICS_PORT={port}" in worker.output()
    assert "give each worker on a host its own port" in worker.output()


def test_a_second_worker_of_the_same_name_stops_and_leaves_the_first_ones_series(tmp_path):
    """Two workers on one host with one name (Celery's default, celery@<host>) would share
    var/metrics/<nodename>: the second one's start emptied it, so the first one's counts
    vanished from its port (before the second even found its port taken), and with a port of
    its own each port then served the other's counts too. The second one must stop, saying
    to give it its own --hostname, and leave the first one's series as they were."""
    env = process_env(REMINDERS_VAR_DIR=str(tmp_path))

    def worker(port: int, label: str) -> Proc:
        return Proc(worker_argv(name="twin"), {**env, "REMINDERS_METRICS_PORT": str(port)}, label)

    def series(samples) -> set:
        return {key for key in samples if key[0] == "reminders_provider_calls_total"}

    with serving_on_a_new_port(
        lambda port: worker(port, "first"), listening=lambda proc, _: proc.ready
    ) as (_first, port):
        before = series(_scrape_worker(port))
        assert before, "the first worker declares its channel's outcomes at zero"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            own_port = probe.getsockname()[1]
        seen = []
        for other_port in (port, own_port):  # the first one's port, then a port of its own
            second = worker(other_port, "second")
            try:
                _wait(
                    lambda proc=second: proc.popen.poll() is not None or proc.ready,
                    timeout=60,
                    what="the second worker to stop or start",
                )
                stopped = second.popen.poll() is not None
            finally:
                second.stop()
            seen.append(
                (
                    "stopped" if stopped else "started",
                    "--hostname" in second.output(),
                    series(_scrape_worker(port)) == before,
                )
            )
    assert seen == [("stopped", True, True), ("stopped", True, True)], seen


def test_a_worker_that_cannot_write_its_metrics_directory_exits_and_says_what_to_do():
    """A REMINDERS_VAR_DIR the worker cannot write (a volume mounted over var/ owned by
    another user; here a path no one can create) raised inside Celery's worker_init, which
    logs a handler's error and goes on: the worker ran with no metrics port, and with the rest
    of its start-up skipped (its statements' lock timeouts among it)."""
    unwritable = "/proc/self/reminders-var"  # not even root can create it
    env = process_env(REMINDERS_VAR_DIR=unwritable, REMINDERS_METRICS_PORT="1")
    worker = Proc(worker_argv(name="unwritable"), env, "unwritable")
    try:
        _wait(
            lambda: worker.popen.poll() is not None or worker.ready,
            timeout=60,
            what="the worker to stop or start",
        )
        stopped = worker.popen.poll() is not None
    finally:
        worker.stop()
    said = f"{unwritable}/metrics" in worker.output() and "REMINDERS_VAR_DIR" in worker.output()
    assert (stopped, worker.popen.returncode != 0, said) == (True, True, True), worker.output()
