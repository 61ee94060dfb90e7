"""Change notices on a fake clock, in process: scan, plan, claim, send through a real SMTP
server on loopback, record. The same flow with a worker process is in
tests/integration/test_notices_e2e.py."""

from __future__ import annotations

from datetime import timedelta

import icalendar
import pytest

from reminders.models import Notice, Reminder, WorkshopRevision
from reminders.worker import pipeline
from reminders.worker.notices import deliver_notices
from workshops.models import Workshop
from workshops.services import workshop_cancel, workshop_reinstate, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def mail(clock, smtp_sink, settings):
    clock.autojump = False
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_NOTICE_SETTLE = 300
    return smtp_sink


@pytest.fixture
def notices_published(monkeypatch):
    sent: list[list[int]] = []
    monkeypatch.setattr("reminders.queue.publish_notices", lambda ids: sent.append(list(ids)))
    return sent


@pytest.fixture
def run(clock, published, notices_published):
    """One scan, then every batch it published, as the workers would; return the scan's counts."""

    def run():
        published.clear()
        notices_published.clear()
        counts = pipeline.scan(clock=clock)
        for batch in list(published):
            pipeline.deliver(batch, clock=clock)
        for batch in list(notices_published):
            deliver_notices(batch, clock=clock)
        return counts

    return run


def _move(workshop, by: timedelta):
    workshop_update(
        workshop=workshop, starts_at=workshop.starts_at + by, ends_at=workshop.ends_at + by
    )


def _calendars(sink):
    """Every message's calendar part, parsed, in the order the server received them."""
    found = []
    for message in sink.messages:
        parsed = message.parsed()
        for part in parsed.walk():
            if part.get_content_type() == "text/calendar" and part.get_filename() is None:
                found.append((parsed, icalendar.Calendar.from_ical(part.get_content())))
    return found


def test_reminded_then_moved_gives_one_update_with_the_new_start(
    clock, make_workshop, enrol, mail, run
):
    workshop = make_workshop(starts_in=timedelta(hours=2))
    enrol(workshop, count=3)
    run()
    assert Reminder.objects.filter(status="sent").count() == 3
    _move(workshop, timedelta(hours=1))
    counts = run()
    assert counts["revisions"] == 1
    assert Notice.objects.count() == 0  # settling
    clock.advance(301)
    run()
    assert Notice.objects.filter(status="sent").count() == 3
    calendars = _calendars(mail)
    assert len(calendars) == 6
    reminder_ics, notice_ics = calendars[0][1], calendars[3][1]
    first, second = reminder_ics.walk("VEVENT")[0], notice_ics.walk("VEVENT")[0]
    assert str(notice_ics["METHOD"]) == "PUBLISH"
    assert calendars[3][0].get_content_type() == "multipart/mixed"
    assert second["SEQUENCE"] > first["SEQUENCE"]
    workshop.refresh_from_db()
    assert second.decoded("DTSTART") == workshop.starts_at
    assert "Changed:" in calendars[3][0]["Subject"]
    # Nothing more: every attendee holds the facts as they are.
    clock.advance(600)
    assert run().get("revisions", 0) == 0
    assert len(mail.messages) == 6


def test_cancelled_then_reinstated(clock, make_workshop, enrol, mail, run, settings):
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=2))
    enrol(workshop, count=2)
    run()
    workshop_cancel(workshop=workshop, reason="The trainer is ill")
    run()
    run()
    cancels = [c for _, c in _calendars(mail)[2:]]
    assert [str(c["METHOD"]) for c in cancels] == ["CANCEL", "CANCEL"]
    assert str(cancels[0].walk("VEVENT")[0]["STATUS"]) == "CANCELLED"
    workshop_reinstate(workshop=Workshop.objects.get(pk=workshop.pk))
    run()
    run()
    back = [c for _, c in _calendars(mail)[4:]]
    assert [str(c["METHOD"]) for c in back] == ["PUBLISH", "PUBLISH"]
    assert [c.walk("VEVENT")[0]["SEQUENCE"] for c in back] == [2, 2]
    assert list(WorkshopRevision.objects.values_list("number", flat=True)) == [1, 2]
