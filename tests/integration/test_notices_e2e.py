"""Change notices end to end: a Celery worker process on Redis, PostgreSQL, a loopback SMTP
server, and the calendar files parsed with the icalendar library.

The test process runs the scans (on a clock that moves only when told, so a settle
period passes without waiting); the worker sends what they publish, by the real clock.
Every assertion counts what the SMTP server received, per attendee, in order.
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from datetime import timedelta

import icalendar
import pytest

from clock import SystemClock
from reminders.models import Notice, Reminder
from reminders.worker import pipeline
from tests.support.processes import celery_worker, process_env
from tests.support.races import wait_until
from workshops.models import Workshop
from workshops.services import (
    enrollment_create,
    workshop_cancel,
    workshop_reinstate,
    workshop_update,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]

_real = SystemClock()
SETTLE = 300


def _env(sink, **extra) -> dict[str, str]:
    return process_env(
        REMINDERS_CHANNEL="smtp", EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(sink.port), **extra
    )


def _quiet() -> bool:
    """Nothing is waiting to be sent: every reminder and notice has its outcome."""
    return not (
        Reminder.objects.filter(status__in=["pending", "queued", "sending"]).exists()
        or Notice.objects.filter(status__in=["pending", "sending"]).exists()
    )


def _calendars(sink) -> dict[str, list]:
    """Each recipient's calendar events, in the order the server received them."""
    found = defaultdict(list)
    for message in sink.received():
        parsed = message.parsed()
        for part in parsed.walk():
            if part.get_content_type() == "text/calendar" and part.get_filename() is None:
                calendar = icalendar.Calendar.from_ical(part.get_content())
                event = calendar.walk("VEVENT")[0]
                found[message.rcpt_tos[0]].append(
                    (
                        str(calendar["METHOD"]),
                        int(event["SEQUENCE"]),
                        event.decoded("DTSTART"),
                        str(event["STATUS"]),
                        str(event["UID"]),
                    )
                )
    return found


def _move(workshop: Workshop, by: timedelta) -> Workshop:
    workshop.refresh_from_db()
    return workshop_update(
        workshop=workshop, starts_at=workshop.starts_at + by, ends_at=workshop.ends_at + by
    )


def test_each_change_reaches_each_reminded_attendee_once_with_its_calendar_update(
    live_clock, broker, smtp_sink, make_workshop, enrol, settings
):
    settings.REMINDERS_NOTICE_SETTLE = SETTLE
    names = ("moved", "moved_twice", "moved_apart", "moved_back", "cancelled", "reinstated")
    workshops = {name: make_workshop(starts_in=timedelta(hours=3), title=name) for name in names}
    people = {name: [e.attendee.email for e in enrol(w, count=2)] for name, w in workshops.items()}
    original = {name: w.starts_at.replace(microsecond=0) for name, w in workshops.items()}  # ICS: s
    hour = timedelta(hours=1)

    def scan_and_wait(what: str) -> None:
        pipeline.scan(clock=live_clock)
        wait_until(_quiet, what=what)

    with celery_worker(_env(smtp_sink), concurrency=2):
        scan_and_wait("the reminders")
        assert Reminder.objects.filter(status="sent").count() == 12

        for name in ("moved", "moved_twice", "moved_apart", "moved_back"):
            _move(workshops[name], hour)
        for name in ("cancelled", "reinstated"):
            workshop_cancel(workshop=workshops[name], reason="The trainer is ill")
        pipeline.scan(clock=live_clock)
        live_clock.advance(SETTLE / 2)
        _move(workshops["moved_twice"], hour)  # within the settle period: one notice
        _move(workshops["moved_back"], -hour)  # undone within it: none
        latecomer = enrollment_create(
            attendee=enrol(make_workshop(starts_in=timedelta(days=9)))[0].attendee,
            workshop=workshops["moved"],
        )
        pipeline.scan(clock=live_clock)
        assert Notice.objects.count() == 0, "a notice before its change settled"
        live_clock.advance(SETTLE / 2 + 1)
        scan_and_wait("the first notices")

        _move(workshops["moved_apart"], hour)  # after its first notice went: a second one
        workshop_reinstate(workshop=Workshop.objects.get(pk=workshops["reinstated"].pk))
        pipeline.scan(clock=live_clock)
        live_clock.advance(SETTLE + 1)
        scan_and_wait("the second notices")
        # Nothing is left to tell anyone.
        live_clock.advance(SETTLE + 1)
        counts = pipeline.scan(clock=live_clock)
        assert "revisions" not in counts and "notices_planned" not in counts

    seen = _calendars(smtp_sink)
    for name in names:
        for email in people[name]:
            events = seen[email]
            # One UID per attendee's copy, from the reminder through every notice.
            assert len({uid for *_, uid in events}) == 1
            assert [sequence for _, sequence, *_ in events] == sorted(
                sequence for _, sequence, *_ in events
            )
            assert events[0][:2] == ("PUBLISH", 0) and events[0][2] == original[name]
            later = [
                (method, start - original[name], status)
                for method, _, start, status, _ in events[1:]
            ]
            expected = {
                "moved": [("PUBLISH", hour, "CONFIRMED")],
                "moved_twice": [("PUBLISH", 2 * hour, "CONFIRMED")],
                "moved_apart": [("PUBLISH", hour, "CONFIRMED"), ("PUBLISH", 2 * hour, "CONFIRMED")],
                "moved_back": [],
                "cancelled": [("CANCEL", timedelta(0), "CANCELLED")],
                "reinstated": [
                    ("CANCEL", timedelta(0), "CANCELLED"),
                    ("PUBLISH", timedelta(0), "CONFIRMED"),
                ],
            }[name]
            assert later == expected, f"{name}: {email} received {events}"
    # The latecomer was never reminded of the old time: a reminder with the new one, no notice.
    late = seen[latecomer.attendee.email]
    assert [(method, sequence, start) for method, sequence, start, *_ in late] == [
        ("PUBLISH", 0, original["moved"] + hour)
    ]
    assert not Notice.objects.filter(attendee=latecomer.attendee).exists()
    statuses = Counter(Notice.objects.values_list("status", flat=True))
    assert statuses == {"sent": 14}  # 2 moved, 2 moved twice, 4 apart, 2 cancelled, 4 back on
    per_key = Counter(m.message_id for m in smtp_sink.received())
    assert set(per_key.values()) == {1}, "a message was sent twice"


def test_a_worker_killed_mid_notice_sends_no_second_notice(
    live_clock, broker, smtp_sink, make_workshop, enrol, settings
):
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=4)
    with celery_worker(_env(smtp_sink), concurrency=1):
        pipeline.scan(clock=live_clock)
        wait_until(_quiet, what="the reminders")
    received = len(smtp_sink.received())
    _move(workshop, timedelta(hours=1))
    smtp_sink.data_delay = 0.5
    env = _env(smtp_sink, REMINDERS_CONCURRENCY="2", REMINDERS_SMTP_CONNECTIONS="2")
    with celery_worker(env, concurrency=1, name="victim") as victim:
        pipeline.scan(clock=live_clock)
        pipeline.scan(clock=live_clock)
        wait_until(
            lambda: Notice.objects.filter(status="sending").exists(), what="a notice in flight"
        )
        victim.signal_group(signal.SIGKILL)
        victim.popen.wait(10)
    wait_until(lambda: smtp_sink.open_connections == 0, what="the dead worker's connections")
    smtp_sink.data_delay = 0
    in_flight = Notice.objects.filter(status="sending").count()
    assert in_flight >= 1
    # Past the lease the scan marks them unknown; the rest go, none twice.
    live_clock.advance(settings.REMINDERS_LEASE_SECONDS + settings.REMINDERS_REQUEUE_AFTER)
    with celery_worker(_env(smtp_sink), concurrency=1, name="rescuer"):
        pipeline.scan(clock=live_clock)
        wait_until(_quiet, what="the other notices")
    statuses = Counter(Notice.objects.values_list("status", flat=True))
    assert statuses["unknown"] == in_flight
    assert statuses["sent"] + statuses["unknown"] == 4
    notices = smtp_sink.received()[received:]
    per_recipient = Counter(m.rcpt_tos[0] for m in notices)
    assert set(per_recipient.values()) == {1}, f"an attendee got two notices: {per_recipient}"
    assert len(per_recipient) >= statuses["sent"]


def test_a_change_five_minutes_before_the_start_is_told_before_it(
    live_clock, broker, smtp_sink, make_workshop, enrol, settings
):
    """The settle shrinks to a quarter of the time left (75 s), and the worker's call starts
    before the workshop's start as it is now, judged at the SMTP server by the real clock."""
    settings.REMINDERS_NOTICE_SETTLE = SETTLE
    workshop = make_workshop(starts_in=timedelta(hours=3), location="Room 1")
    enrol(workshop, count=3)
    with celery_worker(_env(smtp_sink), concurrency=1):
        pipeline.scan(clock=live_clock)
        wait_until(_quiet, what="the reminders")
        soon = live_clock.now() + timedelta(minutes=5)  # the scans judge by this clock
        workshop_update(
            workshop=workshop, starts_at=soon, ends_at=soon + timedelta(hours=1), location="Room 2"
        )
        pipeline.scan(clock=live_clock)
        live_clock.advance(74)
        pipeline.scan(clock=live_clock)
        assert not Notice.objects.exists(), "planned before a quarter of the time left"
        live_clock.advance(2)
        pipeline.scan(clock=live_clock)
        wait_until(_quiet, what="the notices")
    offset = _real.now().timestamp() - _real.monotonic()
    notices = smtp_sink.received()[3:]
    assert len(notices) == 3, list(Notice.objects.values_list("status", "status_reason"))
    assert Notice.objects.filter(status="sent").count() == 3
    assert all(m.arrived_at + offset < soon.timestamp() for m in notices)
