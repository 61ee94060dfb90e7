"""Change notices on a fake clock, in process: scan, plan, claim, send through a real SMTP
server on loopback, record. The same flow with a worker process is in
tests/integration/test_notices_e2e.py."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

import icalendar
import pytest
from django.db.models import Count, F

from reminders.content import local_start
from reminders.models import Notice, Reminder, WorkshopRevision
from reminders.services.notices import HEARD
from reminders.worker import pipeline
from reminders.worker.notices import deliver_notices
from workshops.models import Workshop
from workshops.services import workshop_cancel, workshop_reinstate, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)


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


def _notices_of_a_move(
    clock, make_workshop, enrol, mail, run, notices_published, settings, *, count
):
    """Remind ``count`` attendees, move their workshop an hour earlier and scan until its
    notices are published: return that one batch and how many messages went out before."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=count)
    run()
    reminded = len(mail.received())
    _move(workshop, timedelta(hours=1))
    pipeline.scan(clock=clock)  # the revision
    pipeline.scan(clock=clock)  # its notices published
    [batch] = notices_published
    return batch, reminded


def _move(workshop, by: timedelta):
    workshop.refresh_from_db()
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


def _kinds_by_recipient(sink) -> dict[str, list[tuple[str, int]]]:
    found: dict[str, list[tuple[str, int]]] = {}
    for message, calendar in _calendars(sink):
        event = calendar.walk("VEVENT")[0]
        to = message["To"].addresses[0].addr_spec
        found.setdefault(to, []).append((str(calendar["METHOD"]), int(event["SEQUENCE"])))
    return found


def test_a_notice_not_yet_sent_is_superseded_by_a_newer_revision(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    _move(workshop, timedelta(hours=1))
    pipeline.scan(clock=clock)  # revision 1
    pipeline.scan(clock=clock)  # its notices planned and published, not yet delivered
    assert Notice.objects.filter(number=1, status="pending").count() == 2
    _move(workshop, timedelta(hours=1))
    run()  # revision 2: the first notices are superseded, never sent
    run()
    assert dict(Notice.objects.values_list("number", "status").distinct()) == {
        1: "superseded",
        2: "sent",
    }
    assert [events[1:] for events in _kinds_by_recipient(mail).values()] == [[("PUBLISH", 2)]] * 2


def test_a_notice_claimed_before_a_second_change_is_followed_by_the_next_revision(
    clock, make_workshop, enrol, mail, run, notices_published, settings, monkeypatch
):
    """A notice already claimed when the workshop moves again goes out with the facts it
    was claimed with (no claim watch for notices); the next revision then tells each
    attendee the start as it is, in a calendar update with a higher SEQUENCE."""
    from reminders.worker import notices as notice_worker

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    _move(workshop, timedelta(hours=1))
    pipeline.scan(clock=clock)  # revision 1
    pipeline.scan(clock=clock)  # its notices published
    [batch] = notices_published
    claim = notice_worker.notice_claim

    def claim_then_move_again(**kwargs):
        claimed = claim(**kwargs)
        _move(workshop, timedelta(hours=1))  # committed while the notices are held
        return claimed

    monkeypatch.setattr(notice_worker, "notice_claim", claim_then_move_again)
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 2}
    monkeypatch.setattr(notice_worker, "notice_claim", claim)
    run()  # revision 2, its notices planned and sent
    assert dict(Notice.objects.values_list("number", "status").distinct()) == {
        1: "sent",
        2: "sent",
    }
    workshop.refresh_from_db()
    for sequence in _kinds_by_recipient(mail).values():
        assert sequence == [("PUBLISH", 0), ("PUBLISH", 1), ("PUBLISH", 2)]
    last = {}
    for message, calendar in _calendars(mail):
        last[message["To"].addresses[0].addr_spec] = calendar.walk("VEVENT")[0]
    assert {event.decoded("DTSTART") for event in last.values()} == {workshop.starts_at}


def test_moved_back_then_moved_again_while_settling_is_one_notice(
    clock, make_workshop, enrol, mail, run
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    for by in (1, -1, 1):  # the first revision's facts come back as the third's
        _move(workshop, timedelta(hours=by))
        run()
        clock.advance(60)
    clock.advance(300)
    run()
    run()
    assert Notice.objects.filter(status="sent").count() == 2
    assert [events[1:] for events in _kinds_by_recipient(mail).values()] == [[("PUBLISH", 3)]] * 2


def test_a_change_five_minutes_before_the_start_settles_in_a_quarter_of_it(
    clock, make_workshop, enrol, mail, run
):
    """REMINDERS_NOTICE_SETTLE is 300 s, but only 75 s are left to wait for more edits."""
    workshop = make_workshop(starts_in=timedelta(hours=3), location="Room 1")
    enrol(workshop, count=1)
    run()
    clock.advance((timedelta(hours=3) - timedelta(minutes=5)).total_seconds())
    workshop_update(workshop=workshop, location="Room 2")
    run()
    clock.advance(74)
    run()
    assert not Notice.objects.exists()
    clock.advance(1)
    run()
    notice = Notice.objects.get()
    assert notice.status == "sent" and notice.sent_at < workshop.starts_at


def test_no_notice_call_starts_after_the_start(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    workshop_update(workshop=workshop, location="Room 9")
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    batches = list(notices_published)
    clock.advance(3 * 3600)  # the workers were busy until the start
    for batch in batches:
        deliver_notices(batch, clock=clock)
    pipeline.scan(clock=clock)
    assert len(mail.messages) == 2  # the reminders only
    assert set(Notice.objects.values_list("status", "status_reason")) == {
        ("missed", "the workshop started before the notice could be sent")
    }


def test_notices_sent_are_recorded_through_a_lost_database_connection(
    clock, make_workshop, enrol, mail, run, notices_published, settings, monkeypatch
):
    """As a reminder's (C7): the connection dies between the sends and the record; the
    record waits for the database and keeps the outcomes, instead of leaving the notices
    to the lease (unknown on smtp)."""
    from django.db import connection, connections

    from reminders.worker import notices as notice_worker

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    workshop_update(workshop=workshop, location="Room 9")
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    [batch] = notices_published
    deliver = notice_worker.bridge.deliver_envelopes

    def deliver_then_lose_the_connection(*args, **kwargs):
        results = deliver(*args, **kwargs)
        other = connections.create_connection("default")
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid]
            )
        other.close()
        return results

    monkeypatch.setattr(notice_worker.bridge, "deliver_envelopes", deliver_then_lose_the_connection)
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 2}
    assert set(Notice.objects.values_list("status", flat=True)) == {"sent"}
    assert len(mail.messages) == 4


def test_an_erased_attendee_gets_no_notice_and_their_pending_one_is_silenced(
    clock, make_workshop, enrol, mail, run, notices_published, settings, django_user_model
):
    """Erasure cancels the enrollment of a reminded attendee; their address is gone, so no
    cancellation notice is planned for them, and one already planned is never sent."""
    from reminders.services.erasure import attendees_erase
    from workshops.models import Attendee

    settings.REMINDERS_NOTICE_SETTLE = 0
    staff = django_user_model.objects.create_user("staff")
    workshop = make_workshop(starts_in=timedelta(hours=3))
    ada, bob, cy = (e.attendee for e in enrol(workshop, count=3))
    run()
    attendees_erase(attendees=Attendee.objects.filter(pk=ada.pk), reason="asked", actor=staff)
    run()
    run()
    assert not Notice.objects.filter(attendee=ada).exists()
    # A notice planned, then its attendee erased before a worker takes it.
    workshop_update(workshop=workshop, location="Room 9")
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    batches = list(notices_published)
    attendees_erase(attendees=Attendee.objects.filter(pk=bob.pk), reason="asked", actor=staff)
    for batch in batches:
        deliver_notices(batch, clock=clock)
    assert dict(Notice.objects.values_list("attendee_id", "status")) == {
        bob.pk: "silenced",
        cy.pk: "sent",
    }
    received = [m.parsed()["To"].addresses[0].addr_spec for m in mail.messages]
    assert received.count(Attendee.objects.get(pk=cy.pk).email) == 2  # reminder, notice
    assert len(received) == 4  # three reminders, one notice


def test_an_attendee_who_cancels_after_the_reminder_gets_a_cancellation_alone(
    clock, make_workshop, enrol, mail, run, settings
):
    from workshops.services import enrollment_cancel

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    leaving, staying = enrol(workshop, count=2)
    run()
    enrollment_cancel(enrollment=leaving)
    run()
    run()
    assert _kinds_by_recipient(mail) == {
        leaving.attendee.email: [("PUBLISH", 0), ("CANCEL", 1)],
        staying.attendee.email: [("PUBLISH", 0)],
    }
    # Told: a later move reaches only the one still enrolled.
    _move(workshop, timedelta(hours=1))
    run()
    run()
    assert _kinds_by_recipient(mail)[leaving.attendee.email] == [("PUBLISH", 0), ("CANCEL", 1)]
    assert _kinds_by_recipient(mail)[staying.attendee.email] == [("PUBLISH", 0), ("PUBLISH", 2)]


def test_an_attendee_whose_reminder_is_unknown_gets_the_notice(
    clock, make_workshop, enrol, mail, run, settings
):
    """They may hold the old time: a notice they did not need costs less than a wasted trip."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    Reminder.objects.filter(pk=Reminder.objects.order_by("pk")[0].pk).update(status="unknown")
    _move(workshop, timedelta(hours=1))
    run()
    run()
    assert Notice.objects.filter(status="sent").count() == 2


def test_a_change_made_with_queryset_update_is_noticed(clock, make_workshop, enrol, mail, run):
    """No hook on a write path: the scan finds the difference however the row changed."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    Workshop.objects.filter(pk=workshop.pk).update(join_url="https://meet.example.com/new")
    run()
    clock.advance(301)
    run()
    [(message, _)] = _calendars(mail)[1:]
    assert "https://meet.example.com/new" in message.get_body(("plain",)).get_content()


def test_two_scans_racing_number_one_revision_and_plan_one_notice_each(
    clock, make_workshop, enrol, mail, run, settings
):
    from reminders.services.notices import notices_plan, notices_revise
    from tests.support.races import race

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshops = [make_workshop(starts_in=timedelta(hours=3)) for _ in range(5)]
    for workshop in workshops:
        enrol(workshop, count=3)
    run()
    for workshop in workshops:
        _move(workshop, timedelta(hours=1))
    revised = race(*[lambda: notices_revise(clock=clock)] * 4)
    assert sum(revised) == 5
    planned = race(*[lambda: notices_plan(clock=clock)] * 4)
    assert sum(planned) == 15
    assert WorkshopRevision.objects.count() == 5
    assert Notice.objects.count() == 15


@pytest.mark.parametrize(
    ("language", "subject", "line"),
    [
        ("de", "Geändert: ", "Raum 2 (bisher Raum 1)"),
        ("fr", "Modifié : ", "Raum 2 (auparavant Raum 1)"),
    ],
)
def test_the_notice_is_written_in_the_attendees_language(
    clock, make_workshop, make_attendee, mail, run, settings, language, subject, line
):
    from workshops.services import enrollment_create

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3), location="Raum 1")
    enrollment_create(attendee=make_attendee(language=language), workshop=workshop)
    run()
    workshop_update(workshop=workshop, location="Raum 2")
    run()
    run()
    message = mail.messages[-1].parsed()
    assert message["Subject"].startswith(subject)
    assert line in message.get_body(("plain",)).get_content()


def test_a_redelivered_batch_sends_no_second_notice(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=3)
    run()
    _move(workshop, timedelta(hours=1))
    pipeline.scan(clock=clock)
    pipeline.scan(clock=clock)
    [batch] = notices_published
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 3}
    assert deliver_notices(batch, clock=clock) == {}  # the broker delivered it twice
    assert len(mail.messages) == 6


def test_a_soft_time_limit_mid_notice_batch_records_what_is_known(
    clock, make_workshop, enrol, mail, run, notices_published, settings, monkeypatch
):
    """As a reminder batch's (C5): the soft limit lands while a chunk of notices is in
    flight. Those calls drain and are recorded sent with the chunk before; what was never
    claimed stays pending, none is left ``sending``, and the interruption is what the batch
    raises."""
    import os
    import signal
    import threading

    from billiard.exceptions import SoftTimeLimitExceeded

    from reminders.worker import bridge

    settings.REMINDERS_SMTP_CONNECTIONS = 2  # chunks of 2
    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=8
    )
    mail.data_delay = 1.0  # each chunk's calls stay in flight for a second
    deliver = bridge.deliver_envelopes
    chunks = []

    def deliver_and_interrupt_the_second_chunk(*args, **kwargs):
        chunks.append(1)
        if len(chunks) == 2:
            # As Celery's pool does: SIGUSR1, whose handler raises in the waiting thread.
            fire = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
            fire.start()
        return deliver(*args, **kwargs)

    def raise_soft_limit(signum, frame):
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(bridge, "deliver_envelopes", deliver_and_interrupt_the_second_chunk)
    previous = signal.signal(signal.SIGUSR1, raise_soft_limit)
    try:
        with pytest.raises(SoftTimeLimitExceeded):
            deliver_notices(batch, clock=clock)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    statuses = dict(Notice.objects.values_list("status").annotate(n=Count("pk")))
    assert statuses == {"sent": 4, "pending": 4}
    assert len(mail.received()) - reminded == 4


@pytest.mark.parametrize("committed", [True, False], ids=["after_commit", "before_commit"])
def test_a_soft_time_limit_inside_a_notice_claim_leaves_nothing_claimed(
    clock, make_workshop, enrol, mail, run, notices_published, settings, committed
):
    """The limit lands in the claim's statement: after the server ran it (and so committed
    it), the connection busy again, or before it went out. The claimed notices are handed
    back with their attempt refunded, the interruption is what the batch raises, and the
    next batch on the same connection sends every notice once."""
    from billiard.exceptions import SoftTimeLimitExceeded
    from django.db import connection

    settings.REMINDERS_SMTP_CONNECTIONS = 2  # chunks of 2
    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=4
    )
    seen = []

    def interrupt_the_claim(execute, sql, params, many, context):
        if seen or not sql.startswith('UPDATE "reminders_notice" SET "status"'):
            return execute(sql, params, many, context)
        seen.append(sql)
        if committed:
            execute(sql, params, many, context)
            context["connection"].connection.pgconn.send_query(b"SELECT pg_sleep(0.2)")
        raise SoftTimeLimitExceeded()

    with connection.execute_wrapper(interrupt_the_claim):
        with pytest.raises(SoftTimeLimitExceeded):
            deliver_notices(batch, clock=clock)
    assert len(seen) == 1
    rows = set(Notice.objects.values_list("status", "attempts", "claim_token"))
    assert rows == {("pending", 0, None)}
    assert len(mail.received()) == reminded
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 4}
    assert len(mail.received()) == reminded + 4


def test_a_notice_claim_committed_after_the_interruption_is_still_released(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """The limit lands while the notice claim's UPDATE waits for a row another transaction
    holds, and the server runs it to its end (and so commits it) only after the worker
    dropped that connection and opened another: the release queues behind it for the same
    rows, then hands them back, instead of finding nothing and leaving them ``sending``."""
    from billiard.exceptions import SoftTimeLimitExceeded

    from tests.support.races import interrupted_while_it_waits

    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=4
    )
    claim = 'UPDATE "reminders_notice" SET "status"'
    with interrupted_while_it_waits("reminders_notice", batch[0], claim, SoftTimeLimitExceeded):
        with pytest.raises(SoftTimeLimitExceeded):
            deliver_notices(batch, clock=clock)

    assert set(Notice.objects.values_list("status", "attempts", "claim_token")) == {
        ("pending", 0, None)
    }
    assert len(mail.received()) == reminded
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 4}
    assert len(mail.received()) == reminded + 4


def test_cancelled_reinstated_then_cancelled_again_tells_each_change(
    clock, make_workshop, enrol, mail, run, settings
):
    """The first cancel's notice, sent, tells the facts as they are again after the second
    cancel, but the attendee last heard "back on": they hear of the second cancel too."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    for decide in (workshop_cancel, workshop_reinstate, workshop_cancel):
        kwargs = {"reason": "The trainer is ill"} if decide is workshop_cancel else {}
        decide(workshop=Workshop.objects.get(pk=workshop.pk), **kwargs)
        run()
        run()
    for sequence in _kinds_by_recipient(mail).values():
        assert sequence == [("PUBLISH", 0), ("CANCEL", 1), ("PUBLISH", 2), ("CANCEL", 3)]


def test_moved_moved_back_then_moved_again_tells_each_change(
    clock, make_workshop, enrol, mail, run, settings
):
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=5))
    enrol(workshop, count=2)
    run()
    for by in (1, -1, 1):  # each notice sent before the next move
        _move(workshop, timedelta(hours=by))
        run()
        run()
    for sequence in _kinds_by_recipient(mail).values():
        assert [seq for _, seq in sequence] == [0, 1, 2, 3]
    assert not Reminder.objects.exclude(told_starts_at=F("workshop__starts_at")).exists()


def test_a_change_undone_after_its_notices_were_planned_closes_them(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """Moved back before a worker takes them: each attendee holds the facts as they are, so
    their notice is superseded when it is claimed, not left pending until the start."""
    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    _move(Workshop.objects.get(), timedelta(hours=-1))
    clock.advance(60)
    assert deliver_notices(batch, clock=clock) == {}
    assert set(Notice.objects.values_list("status", "status_reason", "updated_at")) == {
        ("superseded", HEARD, clock.now())
    }
    clock.advance(3 * 3600)
    run()
    assert set(Notice.objects.values_list("status", flat=True)) == {"superseded"}
    assert len(mail.messages) == reminded


def test_an_unknown_reminder_sent_again_after_the_change_is_not_followed_by_its_notice(
    clock, make_workshop, enrol, mail, run, published, notices_published, settings,
    django_user_model,
):  # fmt: skip
    """Sent again with the new start once the notices were planned: that attendee's reminder
    tells them the start as it is, so their notice ("was ...") is not sent after it."""
    from reminders.services.replay import reminder_resolve_unknown

    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    again, other = Reminder.objects.order_by("pk")
    Reminder.objects.filter(pk=again.pk).update(status="unknown")
    published.clear()
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=again.pk),
        decision="send_again",
        reason="the provider lost it",
        actor=django_user_model.objects.create_user("staff"),
        clock=clock,
    )
    for reminders in list(published):
        pipeline.deliver(reminders, clock=clock)
    assert len(mail.messages) == reminded + 1
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 1}
    assert dict(Notice.objects.values_list("reminder_id", "status")) == {
        again.pk: "superseded",
        other.pk: "sent",
    }


@pytest.mark.parametrize("after", [3600, 0], ids=["after the start", "at the start"])
def test_a_revision_changed_again_when_the_workshop_starts_is_closed_not_left_settling(
    clock, make_workshop, enrol, mail, run, after
):
    """Edited again after the scan numbered its revision, and the start came before the next
    scan (or is that scan's very instant): no revise follows a started workshop, so the plan
    closes the revision itself, counting no notice planned."""
    workshop = make_workshop(starts_in=timedelta(hours=2), location="Room 1")
    enrol(workshop, count=1)
    run()
    workshop_update(workshop=workshop, location="Room 2")
    assert run()["revisions"] == 1
    workshop_update(workshop=Workshop.objects.get(pk=workshop.pk), location="Room 3")
    clock.advance_to(workshop.starts_at + timedelta(seconds=after))
    assert run().get("notices_planned", 0) == 0
    [revision] = WorkshopRevision.objects.all()
    assert revision.superseded_at is not None
    assert run().get("notices_planned", 0) == 0
    assert not Notice.objects.exists()


def test_a_notice_planned_while_the_previous_one_is_in_flight_says_what_that_one_told(
    clock, make_workshop, enrol, mail, run, notices_published, settings, monkeypatch
):
    """The second move is planned while the first notice is being sent: its "was" is the
    start the first notice told, as the attendee's row holds it when the second is claimed."""
    from reminders.worker import notices as notice_worker

    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    told = Workshop.objects.get().starts_at
    claim = notice_worker.notice_claim

    def claim_then_move_and_plan(**kwargs):
        claimed = claim(**kwargs)
        _move(Workshop.objects.get(), timedelta(hours=1))
        pipeline.scan(clock=clock)  # revision 2
        pipeline.scan(clock=clock)  # its notice planned while the first is in flight
        return claimed

    monkeypatch.setattr(notice_worker, "notice_claim", claim_then_move_and_plan)
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 1}
    monkeypatch.setattr(notice_worker, "notice_claim", claim)
    [second] = notices_published[1:]
    assert deliver_notices(second, clock=clock) == {"notices_sent": 1}
    assert list(Notice.objects.values_list("number", "status")) == [(1, "sent"), (2, "sent")]
    body = mail.messages[-1].parsed().get_body(("plain",)).get_content()
    was = local_start(told, ZoneInfo(Workshop.objects.get().timezone))
    assert f"(was {was})" in " ".join(body.split())  # 13:00 (the reminder's) on the old code


@pytest.mark.parametrize("claimed_before", [False, True])
def test_a_notice_planned_while_a_cancellation_is_in_flight_says_back_on(
    clock, make_workshop, enrol, mail, run, notices_published, settings, monkeypatch,
    claimed_before,
):  # fmt: skip
    """The workshop is reinstated and moved while its cancellation notice is being sent: the
    next notice is planned as "Changed" (the attendee's row still says not cancelled), but the
    last thing they heard is "cancelled", so it goes out as "Back on" (kind and text taken
    when it is claimed, as its "was"). Also when a first claim of it, interrupted before any
    call, froze the text of "Changed"."""
    from reminders.services.notices import notice_claim, notice_release_interrupted
    from reminders.worker import notices as notice_worker

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    notices_published.clear()
    workshop_cancel(workshop=Workshop.objects.get(), reason="The trainer is ill")
    pipeline.scan(clock=clock)  # revision 1
    pipeline.scan(clock=clock)  # its cancellation notice published
    [batch] = notices_published
    claim = notice_worker.notice_claim

    def claim_then_reinstate_move_and_plan(**kwargs):
        claimed = claim(**kwargs)
        workshop_reinstate(workshop=Workshop.objects.get())
        _move(Workshop.objects.get(), timedelta(hours=1))
        pipeline.scan(clock=clock)  # revision 2
        pipeline.scan(clock=clock)  # its notice planned while the cancellation is in flight
        if claimed_before:
            [second] = notices_published[1:]
            early = notice_claim(ids=second, channel="smtp", clock=clock)
            assert [n.kind for n in early.notices] == ["changed"]
            notice_release_interrupted(token=early.token, ids=second, clock=clock)
        return claimed

    monkeypatch.setattr(notice_worker, "notice_claim", claim_then_reinstate_move_and_plan)
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 1}
    monkeypatch.setattr(notice_worker, "notice_claim", claim)
    [second] = notices_published[1:]
    assert deliver_notices(second, clock=clock) == {"notices_sent": 1}
    assert list(Notice.objects.values_list("number", "kind", "status")) == [
        (1, "cancelled", "sent"),
        (2, "reinstated", "sent"),
    ]
    subject = mail.messages[-1].parsed()["Subject"]
    assert subject.startswith("Back on: ")  # "Changed: " on the old code


def test_a_notice_claimed_before_its_attendee_is_erased_is_not_sent_after_the_window(
    live_clock, make_workshop, enrol, mail, run, notices_published, settings, django_user_model,
    monkeypatch,
):  # fmt: skip
    """Staff erase an attendee whose notice a worker has claimed (it holds the old address):
    the erasure silenced only pending notices and notices had no claim watch, so it went out
    however long after the erasure the call came; now no call starts over REVOCATION_WINDOW
    after the erasure commits, as for a cancelled reminder, and the notice ends silenced."""
    from clock import SystemClock
    from reminders.services.erasure import attendees_erase
    from reminders.services.watch import REVOCATION_WINDOW
    from reminders.worker import notices as worker_notices
    from workshops.models import Attendee

    batch, reminded = _notices_of_a_move(
        live_clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    ada, bob = (n.attendee for n in Notice.objects.filter(pk__in=batch).order_by("pk"))
    claim, real = worker_notices.notice_claim, SystemClock()

    def claim_then_erase(**options):
        claimed = claim(**options)
        attendees_erase(
            attendees=Attendee.objects.filter(pk=ada.pk),
            reason="asked",
            actor=django_user_model.objects.create_user("staff"),
        )
        real.sleep_blocking(REVOCATION_WINDOW + 0.5)  # the calls come after the window
        return claimed

    monkeypatch.setattr(worker_notices, "notice_claim", claim_then_erase)
    deliver_notices(batch, clock=real)
    received = [m.parsed()["To"].addresses[0].addr_spec for m in mail.messages[reminded:]]
    assert received == [bob.email]
    assert dict(Notice.objects.values_list("attendee_id", "status")) == {
        ada.pk: "silenced",
        bob.pk: "sent",
    }


def test_a_notice_error_recorded_after_its_attendee_was_erased_keeps_nothing_of_them(
    clock, make_workshop, enrol, mail, run, notices_published, settings, django_user_model
):
    """A call under way when the erasure commits ends with the provider's words, which may
    quote the address: recorded after the erasure, they are scrubbed as the reminders' are."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.erasure import attendees_erase
    from reminders.services.notices import notice_claim, notice_record
    from workshops.models import Attendee

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    claim = notice_claim(ids=batch, channel="smtp", clock=clock)
    [notice] = claim.notices
    email = notice.attendee.email
    attendees_erase(
        attendees=Attendee.objects.filter(pk=notice.attendee_id),
        reason="asked",
        actor=django_user_model.objects.create_user("staff"),
    )
    said = f"SMTP 550 on RCPT TO: 5.1.1 <{email}>: mailbox unknown"
    result = DeliveryResult(
        reminder_id=notice.pk, key=notice.key, outcome=Outcome.PERMANENT, message_id=None,
        error=said, attempts=1, provider_reached=True, maybe_delivered=False,
    )  # fmt: skip
    assert notice_record(claim=claim, results=[result], clock=clock) == {"notices_failed": 1}
    stored = Notice.objects.values_list("status_reason", "last_error").get()
    assert not any(email.split("@")[0] in text for text in stored), stored


def test_a_notice_back_to_pending_after_its_attendee_was_erased_ends_silenced_not_missed(
    clock, make_workshop, enrol, mail, run, notices_published, settings, django_user_model
):
    """A call under way when the erasure commits fails for a while (a 421): its notice goes
    back to pending, which the erasure had silenced. The next claim skips an erased attendee's
    notice, so it waited for the start and ended "missed" as if it were owed; now the claim
    that skips it silences it as erased. Nothing more reaches the provider."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.erasure import attendees_erase
    from reminders.services.notices import ERASED, notice_claim, notice_record
    from workshops.models import Attendee

    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    claim = notice_claim(ids=batch, channel="smtp", clock=clock)
    [notice] = claim.notices
    attendees_erase(
        attendees=Attendee.objects.filter(pk=notice.attendee_id),
        reason="asked",
        actor=django_user_model.objects.create_user("staff"),
    )
    result = DeliveryResult(
        reminder_id=notice.pk, key=notice.key, outcome=Outcome.TRANSIENT, message_id=None,
        error="SMTP 421 try later", attempts=1, provider_reached=True, maybe_delivered=False,
    )  # fmt: skip
    notice_record(claim=claim, results=[result], clock=clock)
    assert Notice.objects.get().status == "pending"
    clock.advance(600)
    notices_published.clear()
    pipeline.scan(clock=clock)
    for published in list(notices_published):
        deliver_notices(published, clock=clock)
    clock.advance(5 * 3600)  # past the start
    pipeline.scan(clock=clock)
    assert Notice.objects.values_list("status", "status_reason").get() == ("silenced", ERASED)
    assert len(mail.messages) == reminded


def test_a_notice_whose_attendee_is_erased_as_it_is_claimed_is_withdrawn_as_erased(
    clock, make_workshop, enrol, mail, run, notices_published, settings, django_user_model
):
    """Staff erase Ada just after her notice's claim took it, before the worker read it to
    write the message (the erasure blanked the address the claim recorded): the claim
    withdraws it as the claim watch would, silenced because she was erased, its attempt
    refunded; it failed 'recipient address is empty'. Bob's goes out."""
    from django.db import connection

    from reminders.services.erasure import attendees_erase
    from tests.support.races import Step
    from workshops.models import Attendee

    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    ada, bob = (n.attendee for n in Notice.objects.filter(pk__in=batch).order_by("pk"))
    actor = django_user_model.objects.create_user("staff")
    notice_table = connection.ops.quote_name(Notice._meta.db_table)
    erased = []

    def erase_after_the_claim(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith(f"UPDATE {notice_table}") and "sent_to" in sql and not erased:
            erasure = Step(
                lambda: attendees_erase(
                    attendees=Attendee.objects.filter(pk=ada.pk), reason="asked", actor=actor
                )
            )
            erasure.start()
            erased.append(erasure.finish())
        return result

    with connection.execute_wrapper(erase_after_the_claim):
        counts = deliver_notices(batch, clock=clock)
    assert len(erased) == 1
    received = [m.parsed()["To"].addresses[0].addr_spec for m in mail.messages[reminded:]]
    assert received == [bob.email]
    rows = Notice.objects.order_by("pk").values_list("status", "status_reason", "attempts")
    assert list(rows) == [("silenced", "the attendee was erased", 0), ("sent", "", 1)]
    assert counts == {"notices_sent": 1}


@pytest.mark.parametrize("others", [1, 0], ids=["with others told", "alone"])
def test_a_notice_perhaps_sent_then_undone_is_followed_by_one_saying_so(
    clock, make_workshop, enrol, mail, run, notices_published, settings, others
):
    """On a channel with keys, Ada's notice of a move got no answer (it may have arrived) and
    waits to be sent again by its key; staff undo the move first. She may hold the moved
    start, so she hears it is back: at the revision that tells the others, or, alone, once
    her notice comes up again. It was superseded by that revision, or waited to the start,
    and she never heard."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.notices import notice_claim, notice_record

    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1 + others
    )
    ada = Notice.objects.filter(pk__in=batch).order_by("pk").first()
    claim = notice_claim(ids=[ada.pk], channel="http", clock=clock)
    no_answer = DeliveryResult(
        reminder_id=ada.pk, key=ada.key, outcome=Outcome.TIMED_OUT, message_id=None,
        error="timed out", attempts=1, provider_reached=True, maybe_delivered=True,
    )  # fmt: skip
    notice_record(claim=claim, results=[no_answer], clock=clock)
    deliver_notices(batch, clock=clock)  # the others'
    _move(ada.workshop, -timedelta(hours=1))
    for _ in range(8):
        clock.advance(61)
        run()
    workshop = Workshop.objects.get(pk=ada.workshop_id)
    to_ada = [m for m in mail.messages[reminded:] if m.rcpt_tos == (ada.attendee.email,)]
    assert len(to_ada) == 1
    body = " ".join(to_ada[0].parsed().get_body(("plain",)).get_content().split())
    moved = local_start(workshop.starts_at + timedelta(hours=1), ZoneInfo(workshop.timezone))
    assert local_start(workshop.starts_at, ZoneInfo(workshop.timezone)) in body
    assert f"(was {moved})" in body
    assert WorkshopRevision.objects.count() == 2
    assert Reminder.objects.get(pk=ada.reminder_id).told_starts_at == workshop.starts_at


def test_a_late_record_of_an_older_notice_does_not_take_back_what_a_newer_one_told(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """Notice 1 is claimed, the workshop moves again and notice 2 is sent and recorded first:
    notice 1's record, coming last, leaves the attendee holding revision 2, so no third
    notice repeats what notice 2 said."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.notices import notice_claim, notice_record, reminders_owed_notice

    def sent(claim):
        [notice] = claim.notices
        result = DeliveryResult(
            reminder_id=notice.pk, key=notice.key, outcome=Outcome.SENT, message_id="<m@x>",
            error="", attempts=1, provider_reached=True, maybe_delivered=False,
        )  # fmt: skip
        return notice_record(claim=claim, results=[result], clock=clock)

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    _move(workshop, timedelta(hours=1))
    pipeline.scan(clock=clock)  # revision 1
    pipeline.scan(clock=clock)  # its notice published
    [[first]] = notices_published
    first_claim = notice_claim(ids=[first], channel="smtp", clock=clock)
    _move(workshop, timedelta(hours=1))
    notices_published.clear()
    pipeline.scan(clock=clock)  # revision 2
    pipeline.scan(clock=clock)  # its notice published
    [[second]] = notices_published
    assert sent(notice_claim(ids=[second], channel="smtp", clock=clock)) == {"notices_sent": 1}
    assert sent(first_claim) == {"notices_sent": 1}
    workshop.refresh_from_db()
    reminder = Reminder.objects.get(workshop=workshop)
    assert (reminder.told_revision, reminder.told_starts_at) == (2, workshop.starts_at)
    assert not reminders_owed_notice(clock=clock).exists()


@pytest.mark.parametrize("change", ["moved again", "cancelled"])
def test_a_notice_no_longer_true_when_its_batch_arrives_is_not_sent(
    clock, make_workshop, enrol, mail, run, notices_published, settings, change
):
    """The workshop changed after the notices were published, before a worker claimed them:
    the claim leaves them for the next revision, which supersedes them and tells the change."""
    batch, reminded = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    workshop = Workshop.objects.get()
    if change == "moved again":
        _move(workshop, timedelta(hours=1))
    else:
        workshop_cancel(workshop=workshop)
    assert deliver_notices(batch, clock=clock) == {}
    assert len(mail.received()) == reminded
    run()
    run()
    assert dict(Notice.objects.values_list("number", "status").distinct()) == {
        1: "superseded",
        2: "sent",
    }
    assert len(mail.received()) == reminded + 2


def test_a_cancellation_undone_before_its_batch_arrives_is_not_sent(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """Moved and cancelled in one revision, then reinstated: its cancellation, not yet claimed,
    is not sent; the attendee hears of the move alone."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    reminded = len(mail.received())
    _move(workshop, timedelta(hours=1))
    workshop.refresh_from_db()
    workshop_cancel(workshop=workshop)
    notices_published.clear()
    pipeline.scan(clock=clock)  # revision 1: moved and cancelled
    pipeline.scan(clock=clock)  # its notice published
    [batch] = notices_published
    assert list(Notice.objects.values_list("kind", flat=True)) == ["cancelled"]
    workshop.refresh_from_db()
    workshop_reinstate(workshop=workshop)
    assert deliver_notices(batch, clock=clock) == {}
    assert len(mail.received()) == reminded
    run()
    run()
    assert list(Notice.objects.values_list("number", "kind", "status")) == [
        (1, "cancelled", "superseded"),
        (2, "changed", "sent"),
    ]
    assert len(mail.received()) == reminded + 1


def test_a_notice_whose_worker_is_lost_is_settled_when_its_lease_ends_not_before(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    from reminders.services.notices import LEASE_LOST, notice_claim, notices_settle

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    [notice] = notice_claim(ids=batch, channel="smtp", clock=clock).notices  # then the worker dies
    clock.advance(settings.REMINDERS_LEASE_SECONDS - 1)
    assert notices_settle(clock=clock) == {}
    clock.advance(1)
    assert notices_settle(clock=clock) == {"notices_reaped": 1}
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason, notice.maybe_sent) == ("unknown", LEASE_LOST, True)


def test_the_notice_claim_judges_by_the_clock_it_is_given(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """The worker's clock, not the process's: by it the workshop has started."""
    from clock import FakeClock
    from reminders.services.notices import STARTED, notice_claim

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    started = FakeClock(Workshop.objects.get().starts_at)
    assert notice_claim(ids=batch, channel="smtp", clock=started).notices == []
    assert list(Notice.objects.values_list("status", "status_reason", "updated_at")) == [
        ("missed", STARTED, started.now())
    ]


def test_a_notice_claimed_is_taken_once_and_stamped_by_its_claim(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """A second claimer (the batch delivered twice at once) takes nothing from the first."""
    from reminders.services.notices import notice_claim

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    clock.advance(60)
    claim = notice_claim(ids=batch, channel="http", clock=clock)
    [notice] = claim.notices
    assert notice_claim(ids=batch, channel="smtp", clock=clock).notices == []
    notice.refresh_from_db()
    assert (notice.status, notice.claim_token, notice.channel) == ("sending", claim.token, "http")
    assert (notice.attempts, notice.updated_at) == (1, clock.now())
    assert notice.lease_expires_at == clock.now() + timedelta(
        seconds=settings.REMINDERS_LEASE_SECONDS
    )
    assert notice.sent_to == notice.attendee.email
    assert notice.text_id is not None  # its text frozen: every send renders from it


@pytest.mark.parametrize("since", ["nothing", "unsubscribed", "started"])
def test_a_batch_delivered_again_leaves_its_sent_notices_as_they_were(
    clock, make_workshop, enrol, mail, run, notices_published, settings, since
):
    """The broker delivers a batch again after its notices went out (and, perhaps, after their
    attendees unsubscribed or the workshop started): what was sent stays recorded sent."""
    from reminders.services.attendance import reminder_unsubscribe

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    assert deliver_notices(batch, clock=clock) == {"notices_sent": 2}
    if since == "unsubscribed":
        for reminder in Reminder.objects.all():
            reminder_unsubscribe(reminder=reminder, clock=clock)
    fields = ("pk", "status", "status_reason", "updated_at")
    before = list(Notice.objects.order_by("pk").values_list(*fields))
    clock.advance(5 * 3600 if since == "started" else 60)
    assert deliver_notices(batch, clock=clock) == {}
    assert list(Notice.objects.order_by("pk").values_list(*fields)) == before


def test_a_notice_back_pending_after_its_attendee_unsubscribed_is_silenced_when_claimed(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.attendance import reminder_unsubscribe
    from reminders.services.notices import UNSUBSCRIBED, notice_claim, notice_record
    from reminders.services.record import retry_delay

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    claim = notice_claim(ids=batch, channel="smtp", clock=clock)
    [notice] = claim.notices
    reminder_unsubscribe(reminder=notice.reminder, clock=clock)  # while the call is under way
    result = DeliveryResult(
        reminder_id=notice.pk, key=notice.key, outcome=Outcome.TRANSIENT, message_id=None,
        error="busy", attempts=1, provider_reached=True, maybe_delivered=False,
    )  # fmt: skip
    notice_record(claim=claim, results=[result], clock=clock)
    clock.advance(retry_delay(1).total_seconds())
    assert notice_claim(ids=batch, channel="smtp", clock=clock).notices == []
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason, notice.updated_at) == (
        "silenced",
        UNSUBSCRIBED,
        clock.now(),
    )


def test_claimed_notices_come_earliest_workshop_first(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """The worker sends them in this order: the one whose start comes first goes first."""
    from reminders.services.notices import notice_claim

    settings.REMINDERS_NOTICE_SETTLE = 0
    later = make_workshop(starts_in=timedelta(hours=5))
    sooner = make_workshop(starts_in=timedelta(hours=3))
    for workshop in (later, sooner):
        enrol(workshop, count=1)
    run()
    for workshop in (later, sooner):  # the later one's notice planned first
        _move(workshop, timedelta(hours=1))
        pipeline.scan(clock=clock)
        pipeline.scan(clock=clock)
    ids = sorted(Notice.objects.values_list("pk", flat=True))
    assert Notice.objects.get(pk=ids[0]).workshop_id == later.pk
    claim = notice_claim(ids=ids, channel="smtp", clock=clock)
    assert [notice.workshop_id for notice in claim.notices] == [sooner.pk, later.pk]


def test_a_failed_publish_leaves_its_notices_to_the_next_dispatch_and_only_them(
    clock, make_workshop, enrol, mail, run, settings
):
    """A batch the broker refused is published again at the next dispatch, not after
    REMINDERS_REQUEUE_AFTER; a batch it took is not."""
    from reminders.services.notices import notices_dispatch, notices_plan, notices_revise

    settings.REMINDERS_NOTICE_SETTLE = 0
    settings.REMINDERS_BATCH_SIZE = 1
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    run()
    _move(workshop, timedelta(hours=1))
    notices_revise(clock=clock)
    assert notices_plan(clock=clock) == 2
    first, second = sorted(Notice.objects.values_list("pk", flat=True))
    published = []

    def refuse_the_second(ids):
        published.append(ids)
        return ids != [second]

    assert notices_dispatch(publish=refuse_the_second, clock=clock) == 2
    assert published == [[first], [second]]
    published.clear()
    assert notices_dispatch(publish=refuse_the_second, clock=clock) == 1
    assert published == [[second]]


def test_the_notices_are_planned_by_the_clock_they_are_given(
    clock, make_workshop, enrol, mail, run, settings
):
    """The scan's clock, not the process's: by it the revision has settled."""
    from clock import FakeClock
    from reminders.services.notices import notices_plan, notices_revise

    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    _move(workshop, timedelta(hours=1))
    notices_revise(clock=clock)
    settled = WorkshopRevision.objects.get().settles_at
    assert settled > clock.now()
    assert notices_plan(clock=FakeClock(settled)) == 1


def test_a_revision_that_settled_is_planned_while_an_earlier_workshops_edit_still_settles(
    clock, make_workshop, enrol, mail, run
):
    """The later workshop was edited first, so its revision settles first: it is planned and
    told then, not held back until the earlier workshop's revision, edited since, settles."""
    later = make_workshop(starts_in=timedelta(hours=5), location="Room 1")
    sooner = make_workshop(starts_in=timedelta(hours=4), location="Room 1")
    for workshop in (later, sooner):
        enrol(workshop, count=1)
    run()
    workshop_update(workshop=later, location="Room 2")
    run()
    clock.advance(200)
    workshop_update(workshop=sooner, location="Room 2")
    run()
    clock.advance(100)  # the later one's revision settled, the sooner one's not yet
    assert run().get("notices_planned", 0) == 1
    assert dict(Notice.objects.values_list("workshop_id", "status")) == {later.pk: "sent"}
    clock.advance(200)
    run()
    assert dict(Notice.objects.values_list("workshop_id", "status")) == {
        later.pk: "sent",
        sooner.pk: "sent",
    }


def test_a_plan_with_no_revision_newly_settled_takes_no_workshop_lock(
    clock, make_workshop, enrol, mail, run
):
    """Revisions planned, or superseded before they were, are not read again: each scan would
    lock their workshops again, one transaction each, for as long as they are kept."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from reminders.services.notices import notices_plan

    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    _move(workshop, timedelta(hours=1))
    run()  # revision 1, settling
    _move(workshop, timedelta(hours=1))
    run()  # revision 2 supersedes it
    clock.advance(301)
    run()  # revision 2 planned and sent
    revisions = WorkshopRevision.objects.values_list("number", "planned_at", "superseded_at")
    assert [(n, p is not None, s is not None) for n, p, s in revisions] == [
        (1, False, True),
        (2, True, False),
    ]
    with CaptureQueriesContext(connection) as queries:
        assert notices_plan(clock=clock) == 0
    assert len(queries) == 1, [query["sql"] for query in queries]


def test_an_enrollment_does_not_wait_for_the_notice_plan_holding_its_workshop(
    clock, make_workshop, enrol, make_attendee, mail, run, settings
):
    """The plan locks its workshop FOR NO KEY UPDATE, as a staff change does: an enrollment's
    foreign-key check (FOR KEY SHARE) does not wait for it, as it would for FOR UPDATE."""
    import threading

    from django.db import transaction

    from reminders.services.notices import notices_plan, notices_revise
    from tests.support.races import Step, blocked_or_done
    from workshops.services import enrollment_create

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    _move(workshop, timedelta(hours=1))
    notices_revise(clock=clock)
    newcomer = make_attendee()
    planned, release = threading.Event(), threading.Event()

    def plan_and_hold() -> None:
        with transaction.atomic():
            assert notices_plan(clock=clock) == 1
            planned.set()
            release.wait(30)

    plan = Step(plan_and_hold)
    plan.start()
    assert planned.wait(10)
    enrolling = Step(lambda: enrollment_create(attendee=newcomer, workshop=workshop))
    enrolling.start()
    blocked_or_done(enrolling)
    waited = enrolling.is_alive()
    release.set()
    plan.finish()
    enrolling.finish()
    assert not waited, "the enrollment waited for the plan's lock on its workshop"
    assert Notice.objects.count() == 1


def test_a_revision_superseded_after_the_plan_read_it_plans_no_notice(
    clock, make_workshop, enrol, mail, run, settings
):
    """Between the plan's read of the settled revisions and its lock of the workshop, another
    scan numbers a newer revision after an edit, and the edit is undone: the superseded one,
    its facts the workshop's again, plans nothing (no claim would take such a notice)."""

    from reminders.services.notices import notices_plan, notices_revise
    from tests.support.races import after_the_first_read

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3), location="Room 1")
    enrol(workshop, count=1)
    run()
    workshop_update(workshop=workshop, location="Room 2")
    notices_revise(clock=clock)  # revision 1, settled

    def edit_revise_and_undo() -> None:
        workshop_update(workshop=Workshop.objects.get(pk=workshop.pk), location="Room 3")
        assert notices_revise(clock=clock) == 1  # revision 2 supersedes 1
        workshop_update(workshop=Workshop.objects.get(pk=workshop.pk), location="Room 2")

    with after_the_first_read(WorkshopRevision, edit_revise_and_undo) as meanwhile:
        assert notices_plan(clock=clock) == 0
    assert len(meanwhile) == 1
    assert not Notice.objects.exists()
    assert WorkshopRevision.objects.get(number=1).planned_at is None


def test_an_attendee_reminded_after_the_change_is_planned_no_notice(
    clock, make_workshop, enrol, mail, run
):
    """Enrolled while the change settles, their reminder told the workshop as it is now: the
    plan makes a notice for the attendee reminded before it only."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    [before] = enrol(workshop, count=1)
    run()
    _move(workshop, timedelta(hours=1))
    assert run()["revisions"] == 1
    [after] = enrol(Workshop.objects.get(pk=workshop.pk), count=1)
    run()  # its reminder sent, with the new start
    clock.advance(301)
    assert run().get("notices_planned", 0) == 1
    assert list(Notice.objects.values_list("attendee_id", "status")) == [
        (before.attendee_id, "sent")
    ]
    assert len(_kinds_by_recipient(mail)[after.attendee.email]) == 1  # the reminder


def test_a_reinstatement_is_planned_as_back_on_for_those_told_it_was_cancelled(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """Its kind as planned is what the trace and the gauge show before a claim (and for good,
    if staff silence it), not "changed" until a claim takes it again."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    workshop_cancel(workshop=workshop, reason="The trainer is ill")
    run()
    run()
    workshop_reinstate(workshop=Workshop.objects.get(pk=workshop.pk))
    pipeline.scan(clock=clock)  # revision 2
    pipeline.scan(clock=clock)  # its notice planned, not yet claimed
    assert list(Notice.objects.values_list("number", "kind", "status")) == [
        (1, "cancelled", "sent"),
        (2, "reinstated", "pending"),
    ]


def test_notices_of_a_change_silenced_before_the_plan_are_planned_silenced_saying_why(
    clock, make_workshop, enrol, mail, run, notices_published, django_user_model
):
    """Staff chose "don't notify" while the change settled: its notices are made silenced with
    that reason (the trace shows it); those of another workshop are made pending, no reason."""
    from reminders.services.notices import SILENCED
    from reminders.services.workshop_decisions import workshops_silence

    quiet, told = (make_workshop(starts_in=timedelta(hours=3)) for _ in range(2))
    for workshop in (quiet, told):
        enrol(workshop, count=1)
    run()
    for workshop in (quiet, told):
        workshop_update(workshop=workshop, location="Room 2")
    assert run()["revisions"] == 2
    workshops_silence(
        workshops=Workshop.objects.filter(pk=quiet.pk),
        reason="Same building",
        actor=django_user_model.objects.create_user("staff"),
        clock=clock,
    )
    clock.advance(301)
    pipeline.scan(clock=clock)  # both planned, neither yet claimed
    assert set(Notice.objects.values_list("workshop_id", "status", "status_reason")) == {
        (quiet.pk, "silenced", SILENCED),
        (told.pk, "pending", ""),
    }


@pytest.mark.parametrize(
    ("channel", "until", "status"),
    [
        ("http", "the lease ends", "pending"),
        ("smtp", "the lease ends", "unknown"),
        ("http", "the workshop starts", "unknown"),
    ],
)
def test_notices_whose_worker_is_lost_are_sent_again_by_their_key_or_end_unknown(
    clock, make_workshop, enrol, mail, run, notices_published, settings, channel, until, status
):
    """Each claim of a lost worker is settled: on a channel with keys, before the start, back
    pending (perhaps sent), to be sent again with its key; without keys, or once the workshop
    has started, unknown and counted as told. Stamped with the settle's time, each counted."""
    from reminders.services.notices import LEASE_LOST, notice_claim, notices_settle

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    claim = notice_claim(ids=batch, channel=channel, clock=clock)  # then the worker dies
    assert len(claim.notices) == 2
    if until == "the lease ends":
        clock.advance(settings.REMINDERS_LEASE_SECONDS)
    else:
        clock.advance_to(Workshop.objects.get().starts_at)
    assert notices_settle(clock=clock) == {"notices_reaped": 2}
    rows = Notice.objects.values_list(
        "status", "status_reason", "maybe_sent", "claim_token", "lease_expires_at", "updated_at"
    )
    reason = "" if status == "pending" else LEASE_LOST
    assert set(rows) == {(status, reason, True, None, None, clock.now())}
    told = set(Reminder.objects.values_list("told_revision", flat=True))
    assert told == ({0} if status == "pending" else {1})
    if status == "pending":
        again = notice_claim(ids=batch, channel=channel, clock=clock)
        assert {n.key for n in again.notices} == {n.key for n in claim.notices}


def test_notices_still_pending_at_the_start_are_closed_missed_or_unknown_by_the_settle(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """One never called, still queued; one whose call got no answer, waiting for its retry:
    at the start the first is missed, the second unknown, both stamped then and unqueued."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.notices import STARTED, notice_claim, notice_record, notices_settle

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=2
    )
    queued, unanswered = sorted(batch)
    claim = notice_claim(ids=[unanswered], channel="http", clock=clock)
    [notice] = claim.notices
    no_answer = DeliveryResult(
        reminder_id=notice.pk, key=notice.key, outcome=Outcome.TIMED_OUT, message_id=None,
        error="timed out", attempts=1, provider_reached=True, maybe_delivered=True,
    )  # fmt: skip
    notice_record(claim=claim, results=[no_answer], clock=clock)
    assert Notice.objects.get(pk=queued).queued_until is not None
    clock.advance_to(Workshop.objects.get().starts_at)
    assert notices_settle(clock=clock) == {"notices_missed": 1, "notices_unknown": 1}
    rows = Notice.objects.values_list("pk", "status", "status_reason", "queued_until", "updated_at")
    assert set(rows) == {
        (queued, "missed", STARTED, None, clock.now()),
        (unanswered, "unknown", STARTED, None, clock.now()),
    }


def test_a_lost_claim_taken_again_before_the_settle_writes_is_left_to_its_new_worker(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """The settle read the notice with its lease ended; before it writes, that claim is handed
    back and another worker claims the notice: the settle's write is fenced by the first
    claim's token, so the new claim keeps it, its lease running."""

    from reminders.services.notices import (
        notice_claim,
        notice_release_interrupted,
        notices_settle,
    )
    from tests.support.races import after_the_first_read

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    first = notice_claim(ids=batch, channel="smtp", clock=clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS)

    def hand_back_and_claim_again():
        assert notice_release_interrupted(token=first.token, ids=batch, clock=clock) == 1
        return notice_claim(ids=batch, channel="smtp", clock=clock)

    with after_the_first_read(Notice, hand_back_and_claim_again) as second:
        assert notices_settle(clock=clock) == {}
    [claim] = second
    assert len(claim.notices) == 1
    notice = Notice.objects.get()
    assert (notice.status, notice.claim_token) == ("sending", claim.token)
    assert notice.lease_expires_at > clock.now()


def test_the_dispatch_publishes_no_notice_of_a_workshop_started_by_the_clock_it_is_given(
    clock, make_workshop, enrol, mail, run, settings
):
    """If the scan's settle gave up (a lock wait), its notices are still pending at the start:
    the dispatch leaves them to the settle, judged by its own clock, not the process's."""
    from clock import FakeClock
    from reminders.services.notices import notices_dispatch, notices_plan, notices_revise

    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=1)
    run()
    _move(workshop, timedelta(hours=1))
    notices_revise(clock=clock)
    assert notices_plan(clock=clock) == 1
    published = []
    started = FakeClock(Workshop.objects.get().starts_at)
    assert notices_dispatch(publish=published.append, clock=started) == 0
    assert published == []
    assert Notice.objects.get().queued_until is None


def test_a_notice_waiting_for_its_retry_is_published_once_the_backoff_ends_not_before(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """Published before, the claim would pass it over and the queue stamp would hold its
    retry back until REMINDERS_REQUEUE_AFTER after that."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services.notices import notice_claim, notice_record, notices_dispatch
    from reminders.services.record import retry_delay

    settings.REMINDERS_RETRY_BASE = 60
    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    claim = notice_claim(ids=batch, channel="smtp", clock=clock)
    [notice] = claim.notices
    busy = DeliveryResult(
        reminder_id=notice.pk, key=notice.key, outcome=Outcome.TRANSIENT, message_id=None,
        error="421 busy", attempts=1, provider_reached=True, maybe_delivered=False,
    )  # fmt: skip
    notice_record(claim=claim, results=[busy], clock=clock)
    published = []
    clock.advance(retry_delay(1).total_seconds() - 1)
    assert notices_dispatch(publish=published.append, clock=clock) == 0
    clock.advance(1)
    assert notices_dispatch(publish=published.append, clock=clock) == 1
    assert published == [batch]
    queued = Notice.objects.values_list("queued_until", "updated_at").get()
    assert queued == (
        clock.now() + timedelta(seconds=settings.REMINDERS_REQUEUE_AFTER),
        clock.now(),
    )


def test_over_the_dispatch_limit_pending_notices_go_soonest_workshop_first(
    clock, make_workshop, enrol, mail, run, settings
):
    """The limit takes the notices whose workshop starts first; one already sent takes no
    place in it."""
    from reminders.services.notices import notices_dispatch, notices_plan, notices_revise

    settings.REMINDERS_NOTICE_SETTLE = 0
    later = make_workshop(starts_in=timedelta(hours=5))
    sooner = make_workshop(starts_in=timedelta(hours=3))
    for workshop in (later, sooner):
        enrol(workshop, count=1)
    run()
    settings.REMINDERS_DISPATCH_LIMIT = 1
    for workshop in (later, sooner):  # the later one's notice planned first
        _move(workshop, timedelta(hours=1))
        notices_revise(clock=clock)
        assert notices_plan(clock=clock) == 1
    published = []
    assert notices_dispatch(publish=published.append, clock=clock) == 1
    assert published == [[Notice.objects.get(workshop=sooner).pk]]
    assert deliver_notices(published[0], clock=clock) == {"notices_sent": 1}
    assert notices_dispatch(publish=published.append, clock=clock) == 1
    assert published[1:] == [[Notice.objects.get(workshop=later).pk]]


def test_a_notice_claimed_after_the_dispatch_read_it_is_not_published_again(
    clock, make_workshop, enrol, mail, run, notices_published, settings
):
    """Its batch went out before and it is due again; a worker claims it between the dispatch's
    read and its write: the write queues pending notices only, so it is not stamped queued nor
    published to a second worker."""

    from reminders.services.notices import notice_claim, notices_dispatch
    from tests.support.races import after_the_first_read

    batch, _ = _notices_of_a_move(
        clock, make_workshop, enrol, mail, run, notices_published, settings, count=1
    )
    clock.advance(settings.REMINDERS_REQUEUE_AFTER)
    published = []
    claim = lambda: notice_claim(ids=batch, channel="smtp", clock=clock)  # noqa: E731
    with after_the_first_read(Notice, claim) as claimed:
        assert notices_dispatch(publish=published.append, clock=clock) == 0
    assert [len(claim.notices) for claim in claimed] == [1]
    assert published == []
    assert Notice.objects.values_list("status", "queued_until").get() == ("sending", None)
