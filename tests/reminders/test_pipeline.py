"""The pipeline on a fake clock: scan, dispatch, claim, send through a real channel, record."""

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from zoneinfo import ZoneInfo

import pytest
from django.db import connections

from reminders.models import Reminder
from reminders.services import reasons, reminders_reap
from reminders.worker import pipeline
from workshops.services import attendee_get_or_create, enrollment_create, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)


def _messages(outbox):
    return [
        message_from_bytes(path.read_bytes(), policy=policy.default)
        for path in outbox.glob("*.eml")
    ]


def test_scan_then_batch_sends_each_due_reminder_once(
    clock, due_reminders, published, smtp_sink, settings
):
    """Counted at a real SMTP server, which records every message it receives (the
    file channel overwrites by key, so counting files could not show a re-send)."""
    clock.autojump = False  # real sockets: the fake clock moves only when told to
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    ids = due_reminders(25)
    counts = pipeline.scan(clock=clock)
    assert counts["dispatched"] == 25
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    # The same messages delivered again (a redelivery) change nothing.
    for batch in published:
        assert pipeline.deliver(batch, clock=clock) == {"skipped": len(batch)}
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 25}
    per_recipient = Counter(r.lower() for m in smtp_sink.received() for r in m.rcpt_tos)
    assert len(per_recipient) == 25 and set(per_recipient.values()) == {1}
    assert sorted(Reminder.objects.values_list("id", flat=True)) == sorted(ids)


def test_a_batchs_chunks_share_its_smtp_sessions(
    clock, due_reminders, published, smtp_sink, settings
):
    """40 reminders in one batch with 4 connections: 10 chunks, each claimed, sent and
    recorded before the next, over the same 4 SMTP sessions (not 4 new ones per chunk)."""
    from reminders.models import DeliveryAttempt

    clock.autojump = False
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_SMTP_CONNECTIONS = 4
    due_reminders(40)
    pipeline.scan(clock=clock)
    [batch] = published
    assert pipeline.deliver(batch, clock=clock)["sent"] == 40
    assert len(smtp_sink.received()) == 40
    assert smtp_sink.stats()["connections_opened"] == 4
    assert DeliveryAttempt.objects.values("claim_token").distinct().count() == 10


def test_message_shows_the_start_in_the_attendees_zone_on_a_dst_day(clock, outbox, settings):
    """T5: 09:00 in Berlin on the spring-forward day is 07:00 UTC, shown as 09:00 CEST."""
    from workshops.services import workshop_create

    clock.advance_to(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    workshop = workshop_create(
        title="Spring forward",
        starts_at=datetime(2026, 3, 29, 9, 0, tzinfo=ZoneInfo("Europe/Berlin")),
        duration=timedelta(hours=2),
        timezone="Europe/Berlin",
        clock=clock,
    )
    ny, _ = attendee_get_or_create(
        email="ny@example.com", name="New Yorker", timezone="America/New_York"
    )
    local, _ = attendee_get_or_create(email="be@example.com", name="Berliner")
    for attendee in (ny, local):
        enrollment_create(attendee=attendee, workshop=workshop)
    reminders = list(Reminder.objects.all())
    assert {r.deadline_at for r in reminders} == {datetime(2026, 3, 29, 6, 30, tzinfo=UTC)}
    pipeline.deliver([r.pk for r in reminders], clock=clock)
    by_recipient = {m["To"].addresses[0].addr_spec: m for m in _messages(outbox)}
    assert by_recipient["be@example.com"]["Subject"] == (
        "Reminder: Spring forward starts Sunday 29 March 2026 at 09:00 CEST"
    )
    # New York springs forward on 8 March: 03:00 EDT, and the Berlin time too.
    # The text is wrapped for mail readers: compare it unwrapped.
    ny_text = " ".join(by_recipient["ny@example.com"].get_body(("plain",)).get_content().split())
    assert "Sunday 29 March 2026 at 03:00 EDT (America/New_York)" in ny_text
    assert "Sunday 29 March 2026 at 09:00 CEST where it is held (Europe/Berlin)" in ny_text
    ics = [part for part in by_recipient["be@example.com"].iter_attachments()][0]
    assert ics.get_content_type() == "text/calendar"
    assert "DTSTART:20260329T070000Z" in ics.get_content()


def test_backlog_of_forty_minutes_is_missed_never_sent_late(
    clock, due_reminders, published, outbox
):
    """T1: workers down for 40 minutes; past-deadline work is marked, not sent."""
    due_reminders(10, starts_in=timedelta(minutes=60))
    pipeline.scan(clock=clock)
    clock.advance(timedelta(minutes=40).total_seconds())
    counts = pipeline.scan(clock=clock)
    assert counts["missed"] == 10
    for batch in published:  # the workers come back and read the old messages
        pipeline.deliver(batch, clock=clock)
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("missed", reasons.LATE_IN_QUEUE)
    }
    assert list(outbox.glob("*.eml")) == []


def test_workshop_moved_into_the_past_sends_nothing(clock, due_reminders, published, outbox):
    """T4."""
    ids = due_reminders(3)
    pipeline.scan(clock=clock)
    workshop = Reminder.objects.get(pk=ids[0]).workshop
    workshop_update(
        workshop=workshop,
        starts_at=clock.now() - timedelta(hours=1),
        ends_at=clock.now() + timedelta(minutes=1),
    )
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    assert set(Reminder.objects.values_list("status", flat=True)) == {"missed"}
    assert list(outbox.glob("*.eml")) == []


@pytest.mark.parametrize("path", ["service", "queryset update"])
def test_a_queued_reminder_whose_workshop_moved_past_its_window_waits_as_pending(
    clock, make_workshop, enrol, published, outbox, path
):
    """Moved days later while its message waits: the row is pending for its new window (not
    queued for days, which says the workers are behind), and is sent once when it opens."""
    from workshops.models import Workshop

    workshop = make_workshop(starts_in=timedelta(hours=2))
    enrol(workshop)
    pipeline.scan(clock=clock)
    later = {"starts_at": workshop.starts_at + timedelta(days=5)}
    later["ends_at"] = later["starts_at"] + timedelta(hours=1)
    if path == "service":
        workshop_update(workshop=workshop, **later)
    else:
        Workshop.objects.filter(pk=workshop.pk).update(**later)
        pipeline.scan(clock=clock)
    [batch] = published
    assert pipeline.deliver(batch, clock=clock) == {"skipped": 1}  # the old message
    clock.advance(timedelta(hours=1).total_seconds())
    pipeline.scan(clock=clock)
    reminder = Reminder.objects.get()
    assert (reminder.status, reminder.status_reason, reminder.queued_until) == (
        "pending",
        reasons.MOVED_LATER,
        None,
    )
    clock.advance_to(later["starts_at"] - timedelta(hours=2))
    pipeline.scan(clock=clock)
    for batch in published[1:]:
        pipeline.deliver(batch, clock=clock)
    assert Reminder.objects.get().status == "sent"
    assert len(list(outbox.glob("*.eml"))) == 1


def test_enrolling_after_the_window_opened_is_reminded_at_the_next_scan(
    clock, make_workshop, enrol, published, outbox
):
    """T6: reminded once, promptly."""
    workshop = make_workshop(starts_in=timedelta(hours=2))
    enrol(workshop, count=2)
    pipeline.scan(clock=clock)
    clock.advance(60)
    enrol(workshop, count=1)
    pipeline.scan(clock=clock)
    assert [len(batch) for batch in published] == [2, 1]
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 3}


def test_two_scans_at_once_queue_each_reminder_once(clock, make_workshop, published):
    """D2: overlapping scans (or two beats) make no extra rows and no extra messages."""
    from workshops.models import Attendee, Enrollment

    workshops = [make_workshop(starts_in=timedelta(hours=2)) for _ in range(20)]
    people = Attendee.objects.bulk_create(
        Attendee(name=f"P{i}", email=f"p{i}@example.com") for i in range(20)
    )
    Enrollment.objects.bulk_create(
        Enrollment(attendee=p, workshop=w) for w in workshops for p in people
    )
    barrier = threading.Barrier(2)
    results = []
    errors: list[BaseException] = []

    def run():
        try:
            barrier.wait()
            results.append(pipeline.scan(clock=clock))
        except BaseException as exc:  # collected: a thread's exception is otherwise lost
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(results) == 2
    assert sum(r["planned"] for r in results) == 400
    assert Reminder.objects.count() == 400
    published_ids = [i for batch in published for i in batch]
    assert len(published_ids) == len(set(published_ids)) == 400


@pytest.mark.parametrize(
    ("channel", "status"), [("http", "pending"), ("file", "pending"), ("smtp", "unknown")]
)
def test_reaper_requeues_with_the_key_or_marks_unknown(
    clock, due_reminders, settings, channel, status
):
    """C1/C2: an expired lease is requeued where the provider dedupes by key, else unknown."""
    from reminders.services import reminder_claim_batch

    ids = due_reminders(2)
    reminder_claim_batch(ids=ids, channel=channel, clock=clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS - 1)
    assert not any(reminders_reap(clock=clock).values())
    clock.advance(1)
    reminders_reap(clock=clock)
    assert set(Reminder.objects.values_list("status", flat=True)) == {status}
    # That the provider then receives the same key (and bytes) on the re-send is
    # tests/reminders/test_fate.py::test_one_key_carries_byte_identical_bodies_across_a_reaped_retry.


def test_reaper_gives_up_on_a_reminder_that_keeps_killing_its_worker(
    clock, due_reminders, settings
):
    """C4/C6: a poison reminder stops coming back once it hits the attempt cap: ``unknown``,
    since each lost worker may have reached the provider, for staff to decide."""
    from reminders.services import reminder_claim_batch

    settings.REMINDERS_MAX_ATTEMPTS = 3
    (reminder_id,) = due_reminders(1, starts_in=timedelta(hours=6))
    for _ in range(3):
        assert reminder_claim_batch(ids=[reminder_id], channel="http", clock=clock).ids
        clock.advance(settings.REMINDERS_LEASE_SECONDS)
        reminders_reap(clock=clock)
    row = Reminder.objects.get(pk=reminder_id)
    assert row.status == "unknown"
    assert row.status_reason == reasons.MAYBE_SENT_NOT_RETRIED.format(
        why=reasons.GAVE_UP.format(attempts=3, error=reasons.LEASE_LOST)
    )


def test_the_scan_records_each_phase_and_what_it_did(clock, due_reminders, published, settings):
    """What /metrics reports as reminders_scan_phase_seconds and reminders_scan_rows."""
    from reminders.models import Dispatch, ScanRun

    due_reminders(4)
    # A dispatch record past REMINDERS_DISPATCH_HISTORY_DAYS: the prune phase removes it.
    old = clock.now() - timedelta(days=settings.REMINDERS_DISPATCH_HISTORY_DAYS, seconds=1)
    Dispatch.objects.create(queued_at=old, expires_at=old, reminder_ids=[1])
    clock.advance(120)  # the monotonic clock far from zero, as on any host
    counts = pipeline.scan(clock=clock)
    run = ScanRun.objects.get(name="scan")
    assert run.counts == counts
    assert not Dispatch.objects.filter(queued_at=old).exists()
    assert counts["dispatched"] == 4
    assert set(run.phase_seconds) == {
        "settle",
        "reap",
        "plan",
        "dispatch",
        "notices",
        "prune",
        "resume",
    }
    assert all(seconds >= 0 for seconds in run.phase_seconds.values())
    assert sum(run.phase_seconds.values()) <= run.duration_seconds + 0.005
    assert run.duration_seconds < 60  # the scan's own time, not a clock reading


def test_the_scan_deletes_expired_staff_sessions_and_keeps_live_ones(clock, published):
    """Django keeps every login's session row past its expiry until something deletes it
    (manage.py clearsessions): the prune phase does, as clearsessions would."""
    from django.contrib.sessions.models import Session

    for key, expiry in (("expired", -1), ("live", 1)):
        Session.objects.create(
            session_key=key.ljust(32, "0"),
            session_data="",
            expire_date=clock.now() + timedelta(seconds=expiry),
        )
    pipeline.scan(clock=clock)
    assert list(Session.objects.values_list("session_key", flat=True)) == ["live".ljust(32, "0")]


def _chain(*errors: BaseException) -> BaseException:
    """Return ``errors[0]`` raised from ``errors[1]``, raised while handling ``errors[2]``,
    as Django's wrapper raises its error from psycopg's, raised during an interruption."""
    outer, *inner = errors
    if inner:
        outer.__cause__ = _chain(*inner)
    return outer


@pytest.mark.parametrize("django_error", ["OperationalError", "InterfaceError", "ProgrammingError"])
def test_what_interrupted_a_database_call_is_found_behind_the_errors_it_caused(django_error):
    import django.db
    import psycopg
    from billiard.exceptions import SoftTimeLimitExceeded

    interruption = SoftTimeLimitExceeded()
    driver = getattr(psycopg, django_error)("another command is already in progress")
    driver.__context__ = interruption
    caused = _chain(getattr(django.db, django_error)("from the driver"), driver)
    assert pipeline.interruption(caused) is interruption
    # A database error with nothing behind it is the database's, not an interruption.
    alone = _chain(getattr(django.db, django_error)("lost"), getattr(psycopg, django_error)("x"))
    assert pipeline.interruption(alone) is alone
    assert pipeline.interruption(interruption) is interruption


def test_a_reminder_that_cannot_be_rendered_fails_alone_saying_why(clock, due_reminders, outbox):
    """Data no form lets in (a bulk update wrote a time zone that does not exist): that row
    fails for good with the reason, its chunk's other reminders are sent."""
    from workshops.models import Workshop

    ids = due_reminders(3, per_workshop=1)
    broken = Reminder.objects.get(pk=ids[1])
    Workshop.objects.filter(pk=broken.workshop_id).update(timezone="Mars/Olympus_Mons")
    counts = pipeline.deliver(ids, clock=clock)
    rows = {pk: (status, reason) for pk, status, reason in
            Reminder.objects.values_list("pk", "status", "status_reason")}  # fmt: skip
    assert counts == {"skipped": 0, "sent": 2, "failed": 1}
    status, reason = rows[ids[1]]
    assert status == "failed" and "could not build the message" in reason
    assert "Mars/Olympus_Mons" in reason
    # No provider was called: the attempt says so, and nothing may have arrived.
    from reminders.models import DeliveryAttempt

    attempt = DeliveryAttempt.objects.get(reminder_id=ids[1])
    assert (attempt.outcome, attempt.provider_calls) == ("permanent", 0)
    assert Reminder.objects.get(pk=ids[1]).maybe_sent is False
    assert [rows[pk][0] for pk in (ids[0], ids[2])] == ["sent", "sent"]
    assert len(list(outbox.glob("*.eml"))) == 2


def test_a_record_the_database_keeps_refusing_gives_up_within_its_window(clock, settings):
    """T12: the record retries 0.5, 1, 2, 4 s apart, then every 5 s, and gives up inside
    REMINDERS_TIME_BOUNDS.record_retry, far inside the lease, leaving the rows to the reaper."""
    from django.db import OperationalError

    tries = []

    def record(**kwargs):
        tries.append(clock.monotonic())
        raise OperationalError("the database is restarting")

    with pytest.raises(OperationalError):
        pipeline.record_with_retry(claim=None, results=[], clock=clock, record=record)
    gaps = [round(b - a, 3) for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps[:5] == [0.5, 1.0, 2.0, 4.0, 5.0] and set(gaps[4:]) == {5.0}
    window = settings.REMINDERS_TIME_BOUNDS.record_retry
    assert window - 5 < tries[-1] - tries[0] <= window


def test_a_batch_reads_its_addresses_once_and_each_claim_its_suppressions(
    clock, due_reminders, outbox, settings
):
    """On PostgreSQL a chunk's claim statement reads the suppressions of the addresses the
    batch read once: no chunk spends a statement of its own on them."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's claim reads the suppressions apart")
    settings.REMINDERS_CONCURRENCY = 2
    ids = due_reminders(6, per_workshop=2)
    sent = []

    def capture(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        assert pipeline.deliver(ids, clock=clock)["sent"] == 6
    suppressions = [sql for sql in sent if "reminders_suppression" in sql]
    assert len(suppressions) == 3, suppressions  # in the three claims, none apart
    assert all("taken AS (UPDATE" in sql for sql in suppressions)


def test_a_soft_limit_landing_in_the_records_wait_still_records_then_raises(clock):
    """T12 near the time limit: the database was away, and the soft limit lands while the
    record waits to try again. The outcomes are known: it tries again at once (the hard
    limit is a stop grace away), records, then raises the interruption."""
    from billiard.exceptions import SoftTimeLimitExceeded
    from django.db import OperationalError

    tries, waits = [], []

    def record(**kwargs):
        tries.append(clock.monotonic())
        if len(tries) == 1:
            raise OperationalError("the database is restarting")
        return {"sent": 4}

    def interrupted_wait(seconds):
        waits.append(seconds)
        raise SoftTimeLimitExceeded()

    clock.sleep_blocking = interrupted_wait
    with pytest.raises(SoftTimeLimitExceeded):
        pipeline.record_with_retry(claim=None, results=[], clock=clock, record=record)
    assert (len(tries), waits) == (2, [0.5])
