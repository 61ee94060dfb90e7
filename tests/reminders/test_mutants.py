"""Edge cases found by mutation testing (make mutate): each test pins a boundary or a
branch that the behaviour tests reach but did not tell apart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Q

from clock import FakeClock
from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from reminders.services import (
    reasons,
    reminder_claim_batch,
    reminder_record_batch,
    reminder_release,
    reminders_dispatch,
    reminders_reap,
    reminders_settle,
    reminders_unpublished,
)
from reminders.services.fate import Fate, Source, reminder_fate
from reminders.services.record import Verdict, reminder_verdict, retry_delay
from tests.support.races import held_rows

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class _NoOffset(tzinfo):
    """A tzinfo that does not know its offset: the datetime counts as naive."""

    def utcoffset(self, dt):
        return None

    def dst(self, dt):
        return None


# -- policy ----------------------------------------------------------------------


def test_a_zero_cutoff_is_allowed():
    policy = ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(0))
    assert policy.deadline_at(NOW) == NOW


def test_the_policy_says_which_rule_it_broke():
    with pytest.raises(ValueError, match=r"^cutoff must not be negative\.$"):
        ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(seconds=-1))
    with pytest.raises(
        ValueError,
        match=r"^lead must be longer than cutoff: the window opens before it closes\.$",
    ):
        ReminderPolicy(lead=timedelta(minutes=5), cutoff=timedelta(minutes=5))


@pytest.mark.parametrize(
    "moment",
    [datetime(2026, 3, 2, 9, 0), datetime(2026, 3, 2, 9, 0, tzinfo=_NoOffset())],
    ids=["naive", "tzinfo-without-offset"],
)
def test_the_deadline_rule_refuses_a_moment_without_an_offset(moment):
    policy = ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(minutes=5))
    with pytest.raises(ValueError, match=r"^The deadline rule needs an aware datetime; got a"):
        policy.deadline_at(moment)
    with pytest.raises(ValueError, match=r"^The deadline rule needs an aware datetime"):
        policy.window_opens_at(moment)


def test_deadline_and_window_come_back_in_utc():
    policy = ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(minutes=5))
    start = datetime(2026, 3, 29, 9, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert policy.deadline_at(start).tzinfo is UTC
    assert policy.window_opens_at(start).tzinfo is UTC
    assert policy.deadline_at(start) == datetime(2026, 3, 29, 6, 55, tzinfo=UTC)


def test_late_start_q_defaults_to_the_workshop_itself():
    policy = ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(minutes=5))
    assert policy.late_start_q(NOW) == Q(starts_at__lte=NOW + timedelta(minutes=5))
    assert policy.late_start_q(NOW, through="workshop__") == Q(
        workshop__starts_at__lte=NOW + timedelta(minutes=5)
    )


def test_lead_start_q_is_a_lead_either_side_of_now():
    policy = ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(minutes=5))
    lead = timedelta(minutes=30)
    assert policy.lead_start_q(NOW) == Q(starts_at__gt=NOW - lead, starts_at__lte=NOW + lead)
    assert policy.lead_start_q(NOW, through="workshop__") == Q(
        workshop__starts_at__gt=NOW - lead, workshop__starts_at__lte=NOW + lead
    )


# -- claim -----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_claim_takes_only_the_ids_it_was_given(clock, due_reminders):
    ids = due_reminders(3)
    claim = reminder_claim_batch(ids=ids[:1], channel="smtp", clock=clock)
    assert claim.ids == ids[:1]
    assert list(Reminder.objects.filter(pk__in=ids[1:]).values_list("status", flat=True)) == [
        "pending",
        "pending",
    ]


@pytest.mark.django_db
def test_the_claim_misses_only_the_late_ids_it_was_given(clock, due_reminders):
    ids = due_reminders(2, per_workshop=1, starts_in=timedelta(hours=1))
    clock.advance(timedelta(minutes=31).total_seconds())
    reminder_claim_batch(ids=ids[:1], channel="smtp", clock=clock)
    assert Reminder.objects.get(pk=ids[0]).status == "missed"
    assert Reminder.objects.get(pk=ids[1]).status == "pending"


@pytest.mark.django_db
def test_the_claim_clears_queue_and_retry_marks_and_stamps_the_row(clock, due_reminders):
    ids = due_reminders(2)
    Reminder.objects.filter(pk__in=ids).update(
        queued_until=clock.now() + timedelta(minutes=5),
        next_attempt_at=clock.now() - timedelta(seconds=1),
    )
    clock.advance(60)
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    assert sorted(claim.ids) == sorted(ids)
    for row in Reminder.objects.filter(pk__in=ids):
        assert (row.queued_until, row.next_attempt_at) == (None, None)
        assert row.updated_at == clock.now()
    assert {a.claimed_at for a in DeliveryAttempt.objects.all()} == {clock.now()}


@pytest.mark.django_db
def test_a_late_claim_clears_queue_and_retry_marks_and_stamps_the_row(clock, due_reminders):
    ids = due_reminders(1, starts_in=timedelta(hours=1))
    Reminder.objects.filter(pk__in=ids).update(
        queued_until=clock.now() + timedelta(minutes=5),
        next_attempt_at=clock.now() + timedelta(minutes=1),
    )
    clock.advance(timedelta(minutes=31).total_seconds())
    reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    row = Reminder.objects.get(pk=ids[0])
    assert (row.status, row.status_reason) == ("missed", reasons.LATE_AT_CLAIM)
    assert (row.queued_until, row.next_attempt_at) == (None, None)
    assert row.updated_at == clock.now()


@pytest.mark.django_db
def test_the_claim_reads_the_clock_it_is_given(clock, due_reminders, settings):
    ids = due_reminders(1)
    own = FakeClock(clock.now() + timedelta(minutes=10))
    reminder_claim_batch(ids=ids, channel="smtp", clock=own)
    lease = own.now() + timedelta(seconds=settings.REMINDERS_LEASE_SECONDS)
    assert Reminder.objects.get(pk=ids[0]).lease_expires_at == lease


@pytest.mark.django_db
def test_the_claimed_worker_name_defaults_to_empty_and_is_cut_at_200(clock, due_reminders):
    first, second = due_reminders(2)
    reminder_claim_batch(ids=[first], channel="smtp", clock=clock)
    reminder_claim_batch(ids=[second], channel="smtp", worker="w" * 300, clock=clock)
    assert DeliveryAttempt.objects.get(reminder_id=first).worker == ""
    assert DeliveryAttempt.objects.get(reminder_id=second).worker == "w" * 200


@pytest.mark.django_db
def test_claimed_reminders_come_by_deadline_with_attendee_and_workshop_loaded(
    clock, make_workshop, enrol, django_assert_num_queries
):
    later = make_workshop(starts_in=timedelta(hours=3))
    sooner = make_workshop(starts_in=timedelta(hours=2))
    enrol(later)
    enrol(sooner)
    ids = list(Reminder.objects.order_by("id").values_list("id", flat=True))
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    assert [r.workshop_id for r in claim.reminders] == [sooner.pk, later.pk]
    with django_assert_num_queries(0):
        assert all(r.attendee.email and r.workshop.title for r in claim.reminders)


# -- record ----------------------------------------------------------------------


def _res(outcome, *, attempts=1, reached=True, maybe=False, error="boom", message_id=None):
    return DeliveryResult(
        reminder_id=1,
        key="k",
        outcome=outcome,
        message_id=message_id,
        error=error,
        attempts=attempts,
        provider_reached=reached,
        maybe_delivered=maybe,
    )


def _maybe(what: str, channel: str = "smtp") -> str:
    return reasons.MAYBE_SENT.format(what=what, channel=channel)


VERDICTS = [
    (_res(Outcome.SENT, message_id="m-1"), "smtp", 0, Verdict("sent", "sent", message_id="m-1")),
    (_res(Outcome.SENT), "smtp", 0, Verdict("sent", "sent", message_id="")),
    (
        _res(Outcome.TIMED_OUT, maybe=True),
        "smtp",
        1,
        Verdict("unknown", "timed_out", reason=_maybe("timed out"), error="boom"),
    ),
    (
        _res(Outcome.CANCELLED, maybe=True),
        "smtp",
        1,
        Verdict("unknown", "cancelled", reason=_maybe("stopped mid-call"), error="boom"),
    ),
    (
        _res(Outcome.TRANSIENT, maybe=True),
        "smtp",
        1,
        Verdict(
            "unknown", "transient", reason=_maybe("failed without a definite answer"), error="boom"
        ),
    ),
    (_res(Outcome.PERMANENT), "smtp", 1, Verdict("failed", "permanent", "boom", "boom")),
    (
        _res(Outcome.EXPIRED, attempts=0, reached=False),
        "smtp",
        1,
        Verdict(
            "pending",
            "not_started",
            error="boom",
            refund_attempt=True,
            late_reason="deadline passed while retrying: boom",
        ),
    ),
    (
        _res(Outcome.EXPIRED, reached=True),
        "http",
        1,
        Verdict(
            "pending",
            "not_started",
            error="boom",
            late_reason="deadline passed while retrying: boom",
        ),
    ),
    (
        _res(Outcome.WITHDRAWN, attempts=0, reached=False),
        "smtp",
        1,
        Verdict(
            "pending",
            "withdrawn",
            error="boom",
            refund_attempt=True,
            late_reason=reasons.MOVED_INSIDE_CUTOFF,
        ),
    ),
    (
        _res(Outcome.WITHDRAWN, attempts=1, reached=False),
        "smtp",
        1,
        Verdict("pending", "withdrawn", error="boom", late_reason=reasons.MOVED_INSIDE_CUTOFF),
    ),
    (
        _res(Outcome.CANCELLED, attempts=0, reached=False),
        "smtp",
        1,
        Verdict(
            "pending",
            "not_started",
            error="boom",
            refund_attempt=True,
            late_reason=reasons.LATE_AT_CLAIM,
        ),
    ),
    (
        _res(Outcome.TRANSIENT, attempts=1, reached=False),
        "smtp",
        1,
        Verdict(
            "pending",
            "transient",
            error="boom",
            retry_at=NOW + timedelta(seconds=30),
            late_reason="deadline passed while retrying: boom",
        ),
    ),
    (
        _res(Outcome.TRANSIENT, attempts=1, reached=True),
        "smtp",
        5,
        # Not tried again: the fate writes failed, or cancelled (reminder_fate's gave_up).
        Verdict("pending", "transient", error="boom", gave_up="gave up after 5 attempts: boom"),
    ),
]


@pytest.mark.parametrize(("result", "channel", "claims", "expected"), VERDICTS)
def test_each_result_gets_exactly_its_verdict(settings, result, channel, claims, expected):
    settings.REMINDERS_MAX_ATTEMPTS = 5
    settings.REMINDERS_RETRY_BASE = 30
    settings.REMINDERS_RETRY_MAX = 600
    reminder = SimpleNamespace(attempts=claims, maybe_sent=False)
    got = reminder_verdict(result=result, reminder=reminder, channel=channel, now=NOW)
    assert got == expected


def test_an_error_is_recorded_with_its_urls_credentials_masked(settings):
    """Issue 34, item 6: whatever a channel put in an error, the row never keeps a secret."""
    settings.REMINDERS_MAX_ATTEMPTS = 5
    result = _res(
        Outcome.PERMANENT, error="HTTP 500 from https://ops:Pw-9876@n.example.com/r?token=Tk-1234"
    )
    reminder = SimpleNamespace(attempts=1, maybe_sent=False)
    got = reminder_verdict(result=result, reminder=reminder, channel="http", now=NOW)
    assert got.error == "HTTP 500 from https://ops:***@n.example.com/r?token=***"
    assert got.reason == got.error


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(0, 10), (1, 10), (2, 20), (3, 40), (4, 80), (9, 1000)]
)
def test_retry_delay_doubles_from_the_base_up_to_the_max(settings, attempts, seconds):
    settings.REMINDERS_RETRY_BASE = 10
    settings.REMINDERS_RETRY_MAX = 1000
    assert retry_delay(attempts) == timedelta(seconds=seconds)


@pytest.mark.django_db
def test_the_record_writes_every_field_of_the_row_and_its_attempt(clock, due_reminders):
    sent_id, failed_id, retry_id, other_id = due_reminders(4)
    claim = reminder_claim_batch(
        ids=[sent_id, failed_id, retry_id, other_id], channel="smtp", clock=clock
    )
    clock.advance(5)
    by_id = {r.pk: r for r in claim.reminders}

    def result(pk, outcome, **fields):
        values = {
            "reminder_id": pk,
            "key": by_id[pk].key,
            "outcome": outcome,
            "message_id": None,
            "error": "",
            "attempts": 1,
            "provider_reached": True,
            "maybe_delivered": False,
        }
        values.update(fields)
        return DeliveryResult(**values)

    long_id = "m" * 300
    long_error = "e" * 300
    counts = reminder_record_batch(
        claim=claim,
        results=[
            result(sent_id, Outcome.SENT, message_id=long_id, attempts=2, maybe_delivered=True),
            result(failed_id, Outcome.PERMANENT, error=long_error),
            result(retry_id, Outcome.TRANSIENT, error="503 busy", attempts=3),
        ],
        clock=clock,
    )
    assert counts == {"sent": 1, "failed": 1, "pending": 1}
    now = clock.now()

    sent = Reminder.objects.get(pk=sent_id)
    assert (sent.status, sent.status_reason, sent.last_error) == ("sent", "", "")
    assert (sent.provider_message_id, sent.sent_at, sent.updated_at) == ("m" * 255, now, now)
    assert (sent.claim_token, sent.lease_expires_at, sent.next_attempt_at) == (None, None, None)

    failed = Reminder.objects.get(pk=failed_id)
    assert (failed.status, failed.status_reason) == ("failed", "e" * 200)
    assert (failed.last_error, failed.provider_message_id, failed.sent_at) == (long_error, "", None)
    assert (failed.claim_token, failed.lease_expires_at) == (None, None)

    retry = Reminder.objects.get(pk=retry_id)
    assert (retry.status, retry.last_error) == ("pending", "503 busy")

    untouched = Reminder.objects.get(pk=other_id)
    assert (untouched.status, untouched.claim_token) == ("sending", claim.token)

    attempts = {a.reminder_id: a for a in DeliveryAttempt.objects.all()}
    assert (
        attempts[sent_id].outcome,
        attempts[sent_id].provider_message_id,
        attempts[sent_id].provider_calls,
        attempts[sent_id].error,
        attempts[sent_id].finished_at,
    ) == ("sent", "m" * 255, 2, "", now)
    assert (attempts[failed_id].outcome, attempts[failed_id].error) == ("permanent", long_error)
    assert (attempts[failed_id].provider_message_id, attempts[failed_id].finished_at) == ("", now)
    assert (attempts[retry_id].outcome, attempts[retry_id].error) == ("transient", "503 busy")
    assert (attempts[retry_id].provider_calls, attempts[retry_id].finished_at) == (3, now)
    assert (attempts[other_id].outcome, attempts[other_id].finished_at) == ("in_flight", None)


@pytest.mark.django_db
def test_record_and_release_read_the_clock_they_are_given(clock, due_reminders):
    first, second = due_reminders(2)
    claim = reminder_claim_batch(ids=[first, second], channel="smtp", clock=clock)
    own = FakeClock(clock.now() + timedelta(minutes=3))
    sent = DeliveryResult(
        reminder_id=first,
        key=claim.reminders[0].key,
        outcome=Outcome.SENT,
        message_id="m",
        error="",
        attempts=1,
        provider_reached=True,
        maybe_delivered=True,
    )
    reminder_record_batch(claim=claim, results=[sent], clock=own)
    assert Reminder.objects.get(pk=first).sent_at == own.now()
    assert reminder_release(claim=claim, ids=[second], clock=own) == 1
    assert Reminder.objects.get(pk=second).updated_at == own.now()
    assert DeliveryAttempt.objects.get(reminder_id=second).finished_at == own.now()


@pytest.mark.django_db
def test_release_hands_back_only_the_ids_it_names(clock, due_reminders):
    first, second = due_reminders(2)
    claim = reminder_claim_batch(ids=[first, second], channel="smtp", clock=clock)
    assert reminder_release(claim=claim, ids=[first], clock=clock) == 1
    assert Reminder.objects.get(pk=first).status == "pending"
    assert Reminder.objects.get(pk=second).status == "sending"
    outcomes = dict(DeliveryAttempt.objects.values_list("reminder_id", "outcome"))
    assert outcomes == {first: "not_started", second: "in_flight"}


@pytest.mark.django_db
def test_release_after_the_deadline_says_the_claim_came_too_late(clock, due_reminders):
    (reminder_id,) = due_reminders(1, starts_in=timedelta(hours=1))
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
    clock.advance(timedelta(minutes=31).total_seconds())
    assert reminder_release(claim=claim, clock=clock) == 1
    row = Reminder.objects.get(pk=reminder_id)
    assert (row.status, row.status_reason) == ("missed", reasons.LATE_AT_CLAIM)


# -- reap ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_reaper_resolves_each_expired_lease_by_channel_and_cap(clock, due_reminders, settings):
    settings.REMINDERS_MAX_ATTEMPTS = 2
    blind, capped, keyed, live = due_reminders(4)
    smtp = reminder_claim_batch(ids=[blind], channel="smtp", clock=clock)
    Reminder.objects.filter(pk=capped).update(attempts=1)
    http = reminder_claim_batch(ids=[capped, keyed], channel="http", clock=clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS)
    reminder_claim_batch(ids=[live], channel="smtp", clock=clock)
    clock.advance(1)
    counts = reminders_reap(clock=clock)
    assert counts == {"requeued": 1, "unknown": 2, "cancelled": 0}
    now = clock.now()
    rows = {r.pk: r for r in Reminder.objects.all()}
    assert (rows[blind].status, rows[blind].status_reason) == ("unknown", reasons.LEASE_LOST)
    assert (rows[capped].status, rows[capped].status_reason) == (
        "unknown",
        reasons.MAYBE_SENT_NOT_RETRIED.format(
            why=reasons.GAVE_UP.format(attempts=2, error=reasons.LEASE_LOST)
        ),
    )
    assert rows[keyed].status == "pending"
    for pk in (blind, capped, keyed):
        assert (rows[pk].claim_token, rows[pk].lease_expires_at) == (None, None)
        assert (rows[pk].last_error, rows[pk].updated_at) == (reasons.LEASE_LOST, now)
    assert (rows[live].status, rows[live].lease_expires_at is not None) == ("sending", True)
    attempts = {a.reminder_id: a for a in DeliveryAttempt.objects.all()}
    for pk, token in ((blind, smtp.token), (capped, http.token), (keyed, http.token)):
        assert (attempts[pk].outcome, attempts[pk].claim_token) == ("lease_expired", token)
        assert (attempts[pk].error, attempts[pk].finished_at) == (reasons.LEASE_LOST, now)
    assert (attempts[live].outcome, attempts[live].finished_at) == ("in_flight", None)
    assert reminders_reap(clock=clock) == dict.fromkeys(counts, 0)


@pytest.mark.django_db
def test_the_reaper_reads_the_clock_it_is_given(clock, due_reminders, settings):
    (blind,) = due_reminders(1)
    reminder_claim_batch(ids=[blind], channel="smtp", clock=clock)
    own = FakeClock(clock.now() + timedelta(seconds=settings.REMINDERS_LEASE_SECONDS + 1))
    assert reminders_reap(clock=own)["unknown"] == 1
    assert Reminder.objects.get(pk=blind).updated_at == own.now()


# -- settle and dispatch ---------------------------------------------------------


@pytest.mark.django_db
def test_the_settle_says_why_each_late_reminder_was_missed(clock, due_reminders):
    retried, long_error, queued, never, on_time = due_reminders(
        4, per_workshop=4, starts_in=timedelta(hours=1)
    ) + due_reminders(1, starts_in=timedelta(hours=5))
    Reminder.objects.filter(pk=retried).update(
        last_error="503 busy", next_attempt_at=clock.now() + timedelta(minutes=1)
    )
    Reminder.objects.filter(pk=long_error).update(last_error="e" * 300)
    Reminder.objects.filter(pk=queued).update(
        status="queued", queued_until=clock.now() + timedelta(hours=2)
    )
    clock.advance(timedelta(minutes=31).total_seconds())
    own = FakeClock(clock.now() + timedelta(seconds=7))
    assert reminders_settle(clock=own)["missed"] == 4
    rows = {r.pk: r for r in Reminder.objects.all()}
    assert rows[retried].status_reason == "deadline passed while retrying: 503 busy"
    assert rows[long_error].status_reason == ("deadline passed while retrying: " + "e" * 300)[:200]
    assert rows[queued].status_reason == reasons.LATE_IN_QUEUE
    assert rows[never].status_reason == reasons.LATE_AT_CLAIM
    for pk in (retried, long_error, queued, never):
        assert rows[pk].status == "missed"
        assert (rows[pk].queued_until, rows[pk].next_attempt_at) == (None, None)
        assert rows[pk].updated_at == own.now()
    assert rows[on_time].status == "pending"


def _one_row_per_workshop(due_reminders, count: int) -> list[Reminder]:
    """``count`` pending reminders, each of a workshop of its own starting in 2 h."""
    ids = [due_reminders(1)[0] for _ in range(count)]
    return [Reminder.objects.select_related("workshop", "enrollment").get(pk=pk) for pk in ids]


@pytest.mark.django_db
def test_the_settle_applies_each_rule_counts_it_and_closes_the_rows_bookkeeping(
    clock, due_reminders
):
    """One row per rule, each changed by a bulk update (no service, no signal); a sent row
    whose reason says "workshop cancelled" is never reopened, whatever the reason says."""
    from workshops.models import Enrollment, Workshop

    rows = _one_row_per_workshop(due_reminders, 8)
    off_workshop, off_enrollment, moved_in, back, re_enrolled, back_late, later, sent = rows
    bookkeeping = {
        "queued_until": clock.now() + timedelta(hours=1),
        "next_attempt_at": clock.now() + timedelta(minutes=5),
        "attempts": 2,
    }
    Reminder.objects.filter(pk__in=[r.pk for r in rows]).update(**bookkeeping)
    cancelled = Workshop.Status.CANCELLED
    Workshop.objects.filter(pk=off_workshop.workshop_id).update(status=cancelled)
    Enrollment.objects.filter(pk=off_enrollment.enrollment_id).update(
        status=Enrollment.Status.CANCELLED
    )
    inside_the_cutoff = clock.now() + timedelta(minutes=20)
    Workshop.objects.filter(pk__in=[moved_in.workshop_id, back_late.workshop_id]).update(
        starts_at=inside_the_cutoff
    )
    for row, reason in (
        (back, reasons.WORKSHOP_CANCELLED),
        (re_enrolled, reasons.ENROLLMENT_CANCELLED),
        (back_late, reasons.WORKSHOP_CANCELLED),
    ):
        Reminder.objects.filter(pk=row.pk).update(status="cancelled", status_reason=reason)
    Reminder.objects.filter(pk=later.pk).update(status="missed", status_reason="was late")
    Reminder.objects.filter(pk=sent.pk).update(
        status="sent", status_reason=reasons.WORKSHOP_CANCELLED
    )
    own = FakeClock(clock.now() + timedelta(seconds=7))

    assert reminders_settle(clock=own) == {"cancelled": 2, "missed": 2, "reopened": 3}

    found = {r.pk: r for r in Reminder.objects.all()}
    expected = {
        off_workshop.pk: ("cancelled", reasons.WORKSHOP_CANCELLED, 2),
        off_enrollment.pk: ("cancelled", reasons.ENROLLMENT_CANCELLED, 2),
        moved_in.pk: ("missed", reasons.LATE_AT_CLAIM, 2),
        back.pk: ("pending", reasons.REINSTATED, 0),
        re_enrolled.pk: ("pending", "", 0),
        back_late.pk: ("missed", reasons.REINSTATED_LATE, 0),
        later.pk: ("pending", reasons.MOVED_LATER, 2),
        sent.pk: ("sent", reasons.WORKSHOP_CANCELLED, 2),
    }
    assert {pk: (r.status, r.status_reason, r.attempts) for pk, r in found.items()} == expected
    for row in rows[:-1]:
        changed = found[row.pk]
        assert (changed.queued_until, changed.next_attempt_at) == (None, None), changed.pk
        assert changed.updated_at == own.now(), changed.pk
    assert found[sent.pk].queued_until == bookkeeping["queued_until"]


@pytest.mark.django_db
def test_a_scoped_settle_changes_only_its_scope_and_reads_it_whatever_its_age(clock, due_reminders):
    """A staff change settles its workshop's rows, however old; the scan's settle, unscoped,
    looks a lead either side of now, so a row of a workshop long over stays as it ended."""
    from django.db.models import Q

    from workshops.models import Workshop

    old, other, old_unscoped = _one_row_per_workshop(due_reminders, 3)
    Reminder.objects.filter(pk__in=[old.pk, old_unscoped.pk]).update(
        status="cancelled", status_reason=reasons.WORKSHOP_CANCELLED
    )
    Workshop.objects.filter(pk=other.workshop_id).update(status=Workshop.Status.CANCELLED)
    clock.advance(timedelta(days=3).total_seconds())  # both old workshops ended two days ago

    assert reminders_settle(clock=clock, scope=Q(workshop=old.workshop_id)) == {
        "cancelled": 0,
        "missed": 1,
        "reopened": 0,
    }
    assert reminders_settle(clock=clock, scope=Q(workshop=old.workshop_id))["missed"] == 0
    found = {r.pk: (r.status, r.status_reason) for r in Reminder.objects.all()}
    assert found[old.pk] == ("missed", reasons.REINSTATED_LATE)
    assert found[other.pk] == ("pending", "")  # not in the scope: left to its own settle
    assert found[old_unscoped.pk] == ("cancelled", reasons.WORKSHOP_CANCELLED)

    reminders_settle(clock=clock)
    found = {r.pk: (r.status, r.status_reason) for r in Reminder.objects.all()}
    assert found[old_unscoped.pk] == ("cancelled", reasons.WORKSHOP_CANCELLED)


@pytest.mark.django_db(transaction=True)
def test_the_scans_settle_locks_reminder_rows_only_so_a_held_workshop_hides_none_of_them(
    clock, due_reminders
):
    """A staff edit in progress holds its workshop's row; the scan's skip-locked chunk still
    settles that workshop's reminders (were the workshop locked too, it would skip them)."""
    from workshops.models import Workshop

    (row,) = _one_row_per_workshop(due_reminders, 1)
    Workshop.objects.filter(pk=row.workshop_id).update(status=Workshop.Status.CANCELLED)

    with held_rows(Workshop.objects.filter(pk=row.workshop_id)) as still_held:
        counts = reminders_settle(clock=clock)
        assert still_held()

    assert counts["cancelled"] == 1
    assert Reminder.objects.get(pk=row.pk).status_reason == reasons.WORKSHOP_CANCELLED


def _recorder():
    sent: list[list[int]] = []

    def publish(ids):
        sent.append(list(ids))

    return sent, publish


@pytest.mark.django_db
def test_dispatch_follows_deadlines_and_stops_at_the_limit(
    clock, make_workshop, enrol, django_capture_on_commit_callbacks, settings
):
    settings.REMINDERS_BATCH_SIZE, settings.REMINDERS_DISPATCH_LIMIT = 1, 2
    for starts_in in (timedelta(hours=5), timedelta(hours=3), timedelta(hours=4)):
        enrol(make_workshop(starts_in=starts_in))
    by_deadline = list(
        Reminder.objects.order_by("workshop__starts_at").values_list("id", flat=True)
    )
    assert by_deadline != sorted(by_deadline)
    clock.advance(5)
    own = FakeClock(clock.now() + timedelta(seconds=3))
    sent, publish = _recorder()
    with django_capture_on_commit_callbacks(execute=True):
        queued = reminders_dispatch(publish=publish, clock=own)
    assert queued == 2
    assert sent == [[by_deadline[0]], [by_deadline[1]]]
    rows = {r.pk: r for r in Reminder.objects.all()}
    for pk in by_deadline[:2]:
        assert (rows[pk].status, rows[pk].updated_at) == ("queued", own.now())
    assert rows[by_deadline[2]].status == "pending"


@pytest.mark.django_db
def test_dispatch_restricted_to_ids_queues_only_those(
    clock, due_reminders, django_capture_on_commit_callbacks
):
    first, second = due_reminders(2)
    sent, publish = _recorder()
    with django_capture_on_commit_callbacks(execute=True):
        assert reminders_dispatch(publish=publish, clock=clock, ids=[second]) == 1
    assert sent == [[second]]
    assert Reminder.objects.get(pk=first).status == "pending"


@pytest.mark.django_db
def test_dispatch_never_requeues_a_finished_reminder_with_a_stale_queue_mark(
    clock, due_reminders, django_capture_on_commit_callbacks
):
    (reminder_id,) = due_reminders(1)
    Reminder.objects.filter(pk=reminder_id).update(
        status="failed", queued_until=clock.now() - timedelta(minutes=1)
    )
    sent, publish = _recorder()
    with django_capture_on_commit_callbacks(execute=True):
        assert reminders_dispatch(publish=publish, clock=clock) == 0
    assert sent == []
    assert Reminder.objects.get(pk=reminder_id).status == "failed"


# -- fate ------------------------------------------------------------------------

POLICY = ReminderPolicy(lead=timedelta(hours=24), cutoff=timedelta(minutes=30))
START = NOW + timedelta(hours=2)
DEADLINE = START - timedelta(minutes=30)


@pytest.mark.parametrize(
    ("source", "retry_at", "expected"),
    [
        (
            Source("cancelled", "active", START),
            None,
            Fate("cancelled", reasons.WORKSHOP_CANCELLED),
        ),
        (
            Source("scheduled", "cancelled", START),
            None,
            Fate("cancelled", reasons.ENROLLMENT_CANCELLED),
        ),
        (
            Source("scheduled", "active", START),
            DEADLINE,
            Fate("missed", "late!"),
        ),
        (
            Source("scheduled", "active", START),
            DEADLINE - timedelta(seconds=1),
            Fate("pending", "", DEADLINE - timedelta(seconds=1)),
        ),
    ],
    ids=["workshop-cancelled", "enrollment-cancelled", "late", "open"],
)
def test_each_fate_follows_the_workshop_now(source, retry_at, expected):
    got = reminder_fate(
        source=source, policy=POLICY, now=NOW, late_reason="late!", retry_at=retry_at
    )
    assert got == expected


@pytest.mark.django_db
def test_a_returned_reminder_keeps_at_most_200_characters_of_reason(clock, due_reminders):
    (reminder_id,) = due_reminders(1, starts_in=timedelta(minutes=30, seconds=20))
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
    result = DeliveryResult(
        reminder_id=reminder_id,
        key=claim.reminders[0].key,
        outcome=Outcome.TRANSIENT,
        message_id=None,
        error="e" * 300,
        attempts=1,
        provider_reached=True,
        maybe_delivered=False,
    )
    reminder_record_batch(claim=claim, results=[result], clock=clock)
    row = Reminder.objects.get(pk=reminder_id)
    assert row.status == "missed"
    assert row.status_reason == reasons.LATE_IN_RETRY.format(error="e" * 300)[:200]


@pytest.mark.django_db
def test_the_reaper_counts_every_row_and_a_keyed_one_past_its_deadline_is_unknown(
    clock, due_reminders, settings
):
    """The lost worker may have reached the provider, and past the deadline the key
    cannot be tried again: ``unknown``, as on a channel without keys, not ``missed``."""
    late = due_reminders(1, starts_in=timedelta(hours=1))
    blind = due_reminders(2)
    reminder_claim_batch(ids=late, channel="http", clock=clock)
    reminder_claim_batch(ids=blind, channel="smtp", clock=clock)
    clock.advance(timedelta(minutes=31).total_seconds())
    counts = reminders_reap(clock=clock)
    assert counts == {"requeued": 0, "unknown": 3, "cancelled": 0}
    row = Reminder.objects.get(pk=late[0])
    assert (row.status, row.status_reason) == (
        "unknown",
        reasons.MAYBE_SENT_NOT_RETRIED.format(
            why=reasons.LATE_IN_RETRY.format(error=reasons.LEASE_LOST)
        ),
    )


@pytest.mark.django_db
def test_the_reaper_leaves_a_finished_row_alone_whatever_its_lease_says(clock, due_reminders):
    (reminder_id,) = due_reminders(1)
    Reminder.objects.filter(pk=reminder_id).update(
        status="sent", lease_expires_at=clock.now() - timedelta(minutes=1), channel="smtp"
    )
    assert sum(reminders_reap(clock=clock).values()) == 0
    assert Reminder.objects.get(pk=reminder_id).status == "sent"


@pytest.mark.django_db
def test_dispatch_leaves_a_late_reminder_to_the_expiry(
    clock, due_reminders, django_capture_on_commit_callbacks
):
    due_reminders(1, starts_in=timedelta(hours=1))
    clock.advance(timedelta(minutes=31).total_seconds())
    sent, publish = _recorder()
    with django_capture_on_commit_callbacks(execute=True):
        assert reminders_dispatch(publish=publish, clock=clock) == 0
    assert sent == []


@pytest.mark.django_db
def test_a_row_in_flight_does_not_use_up_the_dispatch_limit(
    clock, make_workshop, enrol, django_capture_on_commit_callbacks, settings
):
    settings.REMINDERS_DISPATCH_LIMIT = 1
    enrol(make_workshop(starts_in=timedelta(hours=2)))
    enrol(make_workshop(starts_in=timedelta(hours=3)))
    sooner, later = Reminder.objects.order_by("workshop__starts_at").values_list("id", flat=True)
    reminder_claim_batch(ids=[sooner], channel="smtp", clock=clock)
    sent, publish = _recorder()
    with django_capture_on_commit_callbacks(execute=True):
        assert reminders_dispatch(publish=publish, clock=clock) == 1
    assert sent == [[later]]


@pytest.mark.django_db
def test_an_unpublished_batch_is_due_again_now_and_only_its_queued_rows(clock, due_reminders):
    queued, pending, other = due_reminders(3)
    Reminder.objects.filter(pk__in=[queued, other]).update(
        status="queued", queued_until=clock.now() + timedelta(minutes=5)
    )
    own = FakeClock(clock.now() + timedelta(seconds=9))
    assert reminders_unpublished(ids=[queued, pending], clock=own) == 1
    rows = {r.pk: r for r in Reminder.objects.all()}
    assert rows[queued].queued_until == own.now()
    assert rows[pending].queued_until is None
    assert rows[other].queued_until == clock.now() + timedelta(minutes=5)
