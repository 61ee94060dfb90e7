"""/metrics on web: off without METRICS_TOKEN, a bearer token when on, and series read from
PostgreSQL and Redis at a fixed cost per scrape (issue 13, item 1, the web's part)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from reminders.models import Reminder, ScanRun

pytestmark = pytest.mark.django_db

TOKEN = "metrics-test-token-0a1b2c3d4e5f6a7b8"


def _scrape(client, token: str | None = TOKEN):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return client.get("/metrics", **headers)


def _series(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_are_off_without_a_token(client, settings):
    settings.METRICS_TOKEN = ""
    assert _scrape(client).status_code == 404


def test_metrics_ask_for_the_bearer_token(client, settings):
    settings.METRICS_TOKEN = TOKEN
    assert _scrape(client, token=None).status_code == 401
    assert _scrape(client, token="wrong").status_code == 401
    answer = _scrape(client)
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain")


def test_the_series_say_what_the_database_and_the_broker_hold(
    client, settings, make_reminders, clock, redis_url
):
    settings.METRICS_TOKEN = TOKEN
    settings.CELERY_BROKER_URL = redis_url
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()
    make_reminders(3, "failed")
    make_reminders(2, "sending")
    make_reminders(4, "queued")
    clock.advance(90)
    ScanRun.objects.create(
        name="scan",
        finished_at=clock.now(),
        duration_seconds=1.25,
        counts={"planned": 5, "dispatched": 3, "reaped_failed": 1},
        phase_seconds={"plan": 0.5, "dispatch": 0.25},
        completed=7,
    )
    broker.rpush("reminders", "m1", "m2")
    broker.rpush("reminders\x06\x163", "m3")  # kombu's list for priority 3
    broker.rpush("scan", "s1")
    answer = _scrape(client)
    series = _series(answer.content.decode())
    assert series['reminders_by_status{status="failed"}'] == 3
    assert series['reminders_by_status{status="sending"}'] == 2
    assert series['reminders_by_status{status="queued"}'] == 4
    assert series['reminders_by_status{status="sent"}'] == 0
    oldest_queued = min(
        Reminder.objects.filter(status="queued").values_list("queued_at", flat=True)
    )
    assert series['reminders_oldest_seconds{status="queued"}'] == pytest.approx(
        (clock.now() - oldest_queued).total_seconds(), abs=1
    )
    assert series['reminders_oldest_seconds{status="sending"}'] >= 90
    assert series["reminders_scan_last_completed_timestamp_seconds"] == pytest.approx(
        clock.now().timestamp()
    )
    assert series["reminders_scan_seconds"] == 1.25
    assert series["reminders_scans_total"] == 7
    assert series['reminders_scan_rows{phase="planned"}'] == 5
    assert series['reminders_scan_rows{phase="dispatched"}'] == 3
    assert series['reminders_scan_rows{phase="reaped_failed"}'] == 1
    assert series['reminders_scan_phase_seconds{phase="plan"}'] == 0.5
    assert series['reminders_scan_phase_seconds{phase="dispatch"}'] == 0.25
    assert series['reminders_queue_depth{queue="reminders"}'] == 3
    assert series['reminders_queue_depth{queue="scan"}'] == 1
    assert series['reminders_staff_actions_total{action="replay"}'] == 0
    broker.flushdb()


def test_the_queues_age_runs_from_when_a_reminder_entered_it(
    client, settings, make_reminders, make_workshop, clock
):
    """A move, an edit and a new message for rows whose old one expired keep their wait's
    start: the age keeps growing while no worker takes them (workers down)."""
    from reminders.services import reminders_dispatch
    from workshops.services import workshop_update

    settings.METRICS_TOKEN = TOKEN
    workshop = make_workshop(starts_in=timedelta(hours=5))
    ids = make_reminders(2, "queued", workshop=workshop)
    clock.advance(400)  # past REMINDERS_REQUEUE_AFTER (300 s): their message expired
    later = workshop.starts_at + timedelta(hours=1)
    workshop_update(
        workshop=workshop, starts_at=later, ends_at=later + timedelta(hours=1), title="Moved"
    )
    clock.advance(100)
    assert reminders_dispatch(ids=ids, clock=clock, publish=lambda ids: True) == 2
    clock.advance(100)
    series = _series(_scrape(client).content.decode())
    assert series['reminders_oldest_seconds{status="queued"}'] == pytest.approx(600, abs=1)


def test_a_scrape_costs_the_same_queries_for_10_or_1000_reminders(
    client, settings, make_reminders, redis_url
):
    settings.METRICS_TOKEN = TOKEN
    settings.CELERY_BROKER_URL = redis_url
    make_reminders(10, "queued")
    with CaptureQueriesContext(connection) as small:
        assert _scrape(client).status_code == 200
    make_reminders(1000, "queued", starts_in=timedelta(hours=4))
    with CaptureQueriesContext(connection) as large:
        assert _scrape(client).status_code == 200
    assert len(large) == len(small) <= 8, [q["sql"] for q in large]
    # What docs/operations.md ("What to watch") tells the people who size the database.
    operations = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    stated = re.search(r"a scrape costs\s+(\d+) queries", operations)
    assert stated and int(stated[1]) == len(large), (stated and stated[0], len(large))


def test_the_staff_counter_follows_the_audit(client, settings, make_reminders, replayer):
    from reminders.services.replay import reminder_replay

    settings.METRICS_TOKEN = TOKEN
    [pk] = make_reminders(1, "failed")
    reminder_replay(reminders=Reminder.objects.filter(pk=pk), actor=replayer)
    text = _scrape(client).content.decode()
    assert re.search(r'^reminders_staff_actions_total\{action="replay"\} 1\.0$', text, re.M)


def test_metrics_answer_over_plain_http_where_everything_else_redirects(client, settings):
    """Prometheus scrapes inside the network; the HTTPS redirect would send it away."""
    settings.METRICS_TOKEN = TOKEN
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/admin/").status_code == 301
    assert _scrape(client).status_code == 200


def test_queue_depth_on_the_local_runs_filesystem_broker(client, settings, tmp_path):
    """`make run` uses kombu's filesystem broker: a scrape there reads its queue folder."""
    settings.METRICS_TOKEN = TOKEN
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"data_folder_in": str(tmp_path)}
    for name in ("1_a.reminders.msg", "2_b.reminders.msg", "3_c.scan.msg"):
        (tmp_path / name).write_bytes(b"{}")
    answer = _scrape(client)
    assert answer.status_code == 200
    series = _series(answer.content.decode())
    assert series['reminders_queue_depth{queue="reminders"}'] == 2
    assert series['reminders_queue_depth{queue="scan"}'] == 1


def test_reminders_near_their_deadline_and_not_with_a_worker_are_counted(
    client, settings, make_reminders, clock
):
    """A start 35 minutes away puts the deadline 5 minutes away; 3 hours away does not count."""
    settings.METRICS_TOKEN = TOKEN
    make_reminders(2, "queued", starts_in=timedelta(minutes=35))
    make_reminders(3, "pending", starts_in=timedelta(minutes=38))
    make_reminders(1, "sending", starts_in=timedelta(minutes=35))
    make_reminders(4, "queued", starts_in=timedelta(hours=3))
    series = _series(_scrape(client).content.decode())
    assert series['reminders_near_deadline{status="queued"}'] == 2
    assert series['reminders_near_deadline{status="pending"}'] == 3
    # The one with a worker (sending) is in no series: the sum is the 5 without one.
    near = {name: value for name, value in series.items() if "near_deadline{" in name}
    assert sum(near.values()) == 5, near
    # Eleven minutes on, the three-hour ones are still far; the rest are past their deadline.
    clock.advance(11 * 60)
    series = _series(_scrape(client).content.decode())
    assert series['reminders_near_deadline{status="queued"}'] == 2
    assert series['reminders_near_deadline{status="pending"}'] == 3


def test_beats_last_publish_and_the_interval_come_from_its_schedule_row(client, settings, clock):
    from django_celery_beat.models import PeriodicTask

    from reminders.schedule import SCAN_TASK_NAME, ensure_scan_schedule

    settings.METRICS_TOKEN = TOKEN
    ensure_scan_schedule(every=45)
    PeriodicTask.objects.filter(name=SCAN_TASK_NAME).update(last_run_at=None)
    series = _series(_scrape(client).content.decode())
    assert series["reminders_beat_last_published_timestamp_seconds"] == 0
    assert series["reminders_scan_interval_seconds"] == 45
    PeriodicTask.objects.filter(name=SCAN_TASK_NAME).update(last_run_at=clock.now())
    series = _series(_scrape(client).content.decode())
    assert series["reminders_beat_last_published_timestamp_seconds"] == pytest.approx(
        clock.now().timestamp()
    )
    PeriodicTask.objects.filter(name=SCAN_TASK_NAME).update(enabled=False)
    assert _series(_scrape(client).content.decode())["reminders_scan_interval_seconds"] == 0


def test_scrapes_reuse_one_redis_connection(client, settings, redis_url, monkeypatch):
    """A scrape every 15 s must not open a connection to Redis every 15 s."""
    import redis.connection

    settings.METRICS_TOKEN = TOKEN
    settings.CELERY_BROKER_URL = redis_url
    assert _scrape(client).status_code == 200
    opened = []
    on_connect = redis.connection.AbstractConnection.on_connect

    def counting(self, *args, **kwargs):  # runs once per new socket (the handshake)
        opened.append(self)
        return on_connect(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "on_connect", counting)
    for _ in range(5):
        assert _scrape(client).status_code == 200
    assert opened == []


def test_a_dead_broker_leaves_the_database_series_to_the_scrape(
    client, settings, make_reminders, refusing_port, caplog
):
    """Redis down (workers idle, nothing published): the scrape must still carry what the
    database says, so the scan and deadline alerts can fire; only the queue depths, which
    Redis alone knows, are missing (and the log says why)."""
    settings.METRICS_TOKEN = TOKEN
    settings.CELERY_BROKER_URL = f"redis://:secret-pw@127.0.0.1:{refusing_port()}/0"
    make_reminders(2, "failed")
    answer = _scrape(client)
    assert answer.status_code == 200
    series = _series(answer.content.decode())
    assert series['reminders_by_status{status="failed"}'] == 2
    assert "reminders_scan_last_completed_timestamp_seconds" in series
    assert not [name for name in series if name.startswith("reminders_queue_depth")]
    assert "queue depths" in caplog.text and "secret-pw" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_scrape_while_postgresql_is_down_is_a_503_that_says_so(settings, refusing_port, caplog):
    """PostgreSQL stopped (its port refuses connections): every series but the queue depths
    comes from it, so the scrape cannot answer. It says so with a 503 and a line naming the
    database, not a 500 with a traceback in web's log at every scrape (every 15 s)."""
    from django.test import Client

    settings.METRICS_TOKEN = TOKEN
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = refusing_port()
    try:
        answer = Client(raise_request_exception=False).get(
            "/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
        )
    finally:
        connection.close()
        connection.settings_dict.update(saved)
    tracebacks = [record for record in caplog.records if record.exc_info]
    assert (answer.status_code, answer.content, len(tracebacks)) == (
        503,
        b"the database did not answer: no series\n",
        0,
    )


def test_the_last_hours_reports_are_counted_apart_from_what_the_prune_leaves(
    client, settings, make_reminders, clock
):
    """The bounce and complaint alerts need the reports of the last hour. The count kept
    falls at every scan's prune once reports are older than the retention: past it, the
    kept count's change over an hour is what came in less what was pruned (about nothing in
    a steady state), so an alert on it stays quiet at any bounce rate."""
    from reminders.models import DeliveryEvent
    from reminders.services.feedback import delivery_events_prune

    settings.METRICS_TOKEN = TOKEN
    [pk] = make_reminders(1, "sent")
    ages = [("bounced", timedelta(days=91))] * 3 + [
        ("bounced", timedelta(minutes=10)),
        ("bounced", timedelta(minutes=50)),
        ("complained", timedelta(minutes=5)),
        ("bounced", timedelta(minutes=70)),
    ]
    for number, (kind, age) in enumerate(ages):
        DeliveryEvent.objects.create(
            reminder_id=pk, channel="http", event_id=f"e{number}", kind=kind,
            occurred_at=clock.now() - age, received_at=clock.now() - age,
        )  # fmt: skip

    def scraped() -> tuple:
        series = _series(_scrape(client).content.decode())
        return tuple(
            series.get(f'{name}{{channel="http",kind="{kind}"}}')
            for name in ("reminders_delivery_events", "reminders_delivery_events_last_hour")
            for kind in ("bounced", "complained")
        )

    before = scraped()
    assert delivery_events_prune(clock=clock) == 3
    assert (before, scraped()) == ((6, 1, 2, 1), (3, 1, 2, 1))
