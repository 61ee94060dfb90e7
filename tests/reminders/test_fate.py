"""Every return re-derives a reminder's fate from its workshop and enrollment as they are now.

Staff cancel or move a workshop while its reminders are claimed (``sending``);
the record, the release, the reaper and replay then hand rows back. Each test
sets up a row whose own copy (status, deadline) says one thing and whose
workshop or enrollment says another, and checks the row follows the source.
"""

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from reminders.services import (
    reasons,
    reminder_claim_batch,
    reminder_record_batch,
    reminder_release,
    reminder_verdict,
    reminders_reap,
)
from reminders.services.feedback import suppression_addresses
from tests.support.races import after, race
from workshops.models import Workshop
from workshops.services import enrollment_cancel, workshop_cancel, workshop_update

pytestmark = pytest.mark.django_db


def _transient(reminder, **fields):
    values = {
        "reminder_id": reminder.pk,
        "key": reminder.key,
        "outcome": Outcome.TRANSIENT,
        "message_id": None,
        "error": "HTTP 503",
        "attempts": 1,
        "provider_reached": True,
        "maybe_delivered": False,
    }
    values.update(fields)
    return DeliveryResult(**values)


def _claim_one(clock, due_reminders, channel="http", **kwargs):
    (reminder_id,) = due_reminders(1, **kwargs)
    claim = reminder_claim_batch(ids=[reminder_id], channel=channel, clock=clock)
    assert claim.ids == [reminder_id]
    return claim, Reminder.objects.get(pk=reminder_id)


def test_a_workshop_cancelled_while_sending_ends_cancelled_not_pending(clock, due_reminders):
    claim, row = _claim_one(clock, due_reminders)
    workshop_cancel(workshop=row.workshop)
    assert Reminder.objects.get(pk=row.pk).status == "sending"  # the worker's, until it records
    counts = reminder_record_batch(claim=claim, results=[_transient(row)], clock=clock)
    row.refresh_from_db()
    assert counts == {"cancelled": 1}
    assert (row.status, row.status_reason) == ("cancelled", reasons.WORKSHOP_CANCELLED)
    assert row.claim_token is None and row.next_attempt_at is None


def test_an_enrollment_cancelled_while_sending_ends_cancelled_on_release(clock, due_reminders):
    claim, row = _claim_one(clock, due_reminders)
    enrollment_cancel(enrollment=row.enrollment)
    assert reminder_release(claim=claim, clock=clock) == 1
    row.refresh_from_db()
    assert (row.status, row.status_reason, row.attempts) == (
        "cancelled",
        reasons.ENROLLMENT_CANCELLED,
        0,
    )
    assert DeliveryAttempt.objects.get().outcome == "not_started"


def test_a_workshop_moved_later_while_sending_returns_with_the_new_deadline(clock, due_reminders):
    claim, row = _claim_one(clock, due_reminders)
    new_start = row.workshop.starts_at + timedelta(hours=5)
    workshop_update(
        workshop=row.workshop, starts_at=new_start, ends_at=new_start + timedelta(hours=1)
    )
    reminder_record_batch(claim=claim, results=[_transient(row)], clock=clock)
    row.refresh_from_db()
    policy = ReminderPolicy.from_settings()
    assert row.status == "pending"
    assert row.deadline_at == policy.deadline_at(new_start)
    assert row.window_opens_at == policy.window_opens_at(new_start)
    assert row.next_attempt_at > clock.now()


@pytest.mark.parametrize("answer", ["definite", "none"])
def test_a_workshop_moved_inside_the_cutoff_while_sending_ends_missed(answer, clock, due_reminders):
    """Staff move the workshop inside the cutoff while its claimed (keyed) call is out.
    After a 503: ``missed``. After a timeout the provider may have it: ``unknown``."""
    claim, row = _claim_one(clock, due_reminders)
    new_start = clock.now() + timedelta(minutes=20)
    workshop_update(
        workshop=row.workshop, starts_at=new_start, ends_at=new_start + timedelta(hours=1)
    )
    result = _transient(row, **(_NO_ANSWER if answer == "none" else {}))
    reminder_record_batch(claim=claim, results=[result], clock=clock)
    row.refresh_from_db()
    late = reasons.LATE_IN_RETRY.format(error=result.error)
    if answer == "definite":
        assert (row.status, row.status_reason) == ("missed", late)
    else:
        assert (row.status, row.status_reason) == (
            "unknown",
            reasons.MAYBE_SENT_NOT_RETRIED.format(why=late),
        )
    assert row.deadline_at == ReminderPolicy.from_settings().deadline_at(new_start)


def test_a_retry_due_after_the_moved_deadline_is_missed_now(clock, due_reminders, settings):
    """The next try (30 s later) would fall after the new deadline: missed at once."""
    settings.REMINDERS_RETRY_BASE = 600
    claim, row = _claim_one(clock, due_reminders)
    new_start = clock.now() + timedelta(minutes=35)  # deadline in 5 minutes
    workshop_update(
        workshop=row.workshop, starts_at=new_start, ends_at=new_start + timedelta(hours=1)
    )
    reminder_record_batch(claim=claim, results=[_transient(row)], clock=clock)
    assert Reminder.objects.get(pk=row.pk).status == "missed"


_NO_ANSWER = {"outcome": Outcome.TIMED_OUT, "error": "timed out", "maybe_delivered": True}


@pytest.mark.parametrize(
    "answer, status, reason",
    [
        ("definite", "missed", reasons.LATE_IN_RETRY.format(error="HTTP 503")),
        (
            "none",
            "unknown",
            reasons.MAYBE_SENT_NOT_RETRIED.format(
                why=reasons.LATE_IN_RETRY.format(error="timed out")
            ),
        ),
    ],
)
def test_a_keyed_reminder_past_retrying_by_its_deadline_is_missed_only_after_a_definite_answer(
    answer, status, reason, clock, due_reminders
):
    """http honours keys, so a call that got no answer goes back to be tried again; here the
    next try would fall after the deadline (30 s left). After a 503 the provider does not
    have it: ``missed``. After a timeout it may: ``unknown``, never ``missed``."""
    claim, row = _claim_one(clock, due_reminders, starts_in=timedelta(minutes=30, seconds=20))
    result = _transient(row, **(_NO_ANSWER if answer == "none" else {}))
    assert reminder_record_batch(claim=claim, results=[result], clock=clock) == {status: 1}
    row.refresh_from_db()
    assert (row.status, row.status_reason) == (status, reason)
    assert row.claim_token is None and row.next_attempt_at is None


@pytest.mark.parametrize("answer, status", [("definite", "failed"), ("none", "unknown")])
def test_a_keyed_reminder_at_the_attempt_cap_fails_only_after_a_definite_answer(
    answer, status, clock, due_reminders, settings
):
    settings.REMINDERS_MAX_ATTEMPTS = 1
    claim, row = _claim_one(clock, due_reminders)
    result = _transient(row, **(_NO_ANSWER if answer == "none" else {}))
    assert reminder_record_batch(claim=claim, results=[result], clock=clock) == {status: 1}
    row.refresh_from_db()
    gave_up = reasons.GAVE_UP.format(attempts=1, error=result.error)
    assert row.status == status
    assert row.status_reason == (
        gave_up if answer == "definite" else reasons.MAYBE_SENT_NOT_RETRIED.format(why=gave_up)
    )


@pytest.mark.parametrize("answer", ["definite", "none"])
@pytest.mark.parametrize("cap", [3, 1], ids=["retrying", "at-the-cap"])
def test_a_cancel_wins_over_a_call_that_may_have_reached_the_provider(
    cap, answer, clock, due_reminders, settings
):
    """Staff asked for no more sends: ``cancelled``, with the call's attempt in the history,
    whether the call got an answer or not, and at the attempt cap too (not ``failed`` or
    ``unknown``: the cancel is re-derived before the cap is looked at)."""
    settings.REMINDERS_MAX_ATTEMPTS = cap
    claim, row = _claim_one(clock, due_reminders)
    workshop_cancel(workshop=row.workshop)
    result = _transient(row, **(_NO_ANSWER if answer == "none" else {}))
    assert reminder_record_batch(claim=claim, results=[result], clock=clock) == {"cancelled": 1}
    row.refresh_from_db()
    assert (row.status, row.status_reason) == ("cancelled", reasons.WORKSHOP_CANCELLED)
    outcome = "timed_out" if answer == "none" else "transient"
    assert DeliveryAttempt.objects.get().outcome == outcome


def test_the_reaper_requeues_a_keyed_reminder_as_its_workshop_is_now(
    clock, due_reminders, settings
):
    claim, row = _claim_one(clock, due_reminders, channel="http")
    new_start = row.workshop.starts_at + timedelta(hours=2)
    workshop_update(
        workshop=row.workshop, starts_at=new_start, ends_at=new_start + timedelta(hours=1)
    )
    clock.advance(settings.REMINDERS_LEASE_SECONDS)
    assert reminders_reap(clock=clock)["requeued"] == 1
    row.refresh_from_db()
    assert (row.status, row.deadline_at) == (
        "pending",
        ReminderPolicy.from_settings().deadline_at(new_start),
    )


@pytest.mark.parametrize("cap", [3, 1], ids=["retrying", "at-the-cap"])
def test_the_reaper_cancels_a_keyed_reminder_whose_enrollment_was_cancelled(
    cap, clock, due_reminders, settings
):
    settings.REMINDERS_MAX_ATTEMPTS = cap
    claim, row = _claim_one(clock, due_reminders, channel="http")
    enrollment_cancel(enrollment=row.enrollment)
    clock.advance(settings.REMINDERS_LEASE_SECONDS)
    assert reminders_reap(clock=clock)["cancelled"] == 1
    assert Reminder.objects.get(pk=row.pk).status == "cancelled"
    assert DeliveryAttempt.objects.get().outcome == "lease_expired"


def test_a_missed_reminder_comes_back_when_its_workshop_moves_later(clock, make_workshop, enrol):
    """Item 3: missed because the start was moved inside the cutoff, then moved out again."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    inside = clock.now() + timedelta(minutes=10)
    workshop = workshop_update(
        workshop=workshop, starts_at=inside, ends_at=inside + timedelta(hours=1)
    )
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("missed", reasons.MOVED_INSIDE_CUTOFF)
    }
    later = clock.now() + timedelta(hours=6)
    workshop_update(workshop=workshop, starts_at=later, ends_at=later + timedelta(hours=1))
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("pending", reasons.MOVED_LATER)
    }


def test_a_missed_reminder_of_a_cancelled_enrollment_stays_missed_when_moved(
    clock, make_workshop, enrol
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (enrollment,) = enrol(workshop)
    inside = clock.now() + timedelta(minutes=10)
    workshop = workshop_update(
        workshop=workshop, starts_at=inside, ends_at=inside + timedelta(hours=1)
    )
    enrollment_cancel(enrollment=enrollment)
    later = clock.now() + timedelta(hours=6)
    workshop_update(workshop=workshop, starts_at=later, ends_at=later + timedelta(hours=1))
    assert Reminder.objects.get().status == "missed"


@pytest.mark.parametrize("channel", ["smtp", "django", "http"])
def test_maybe_delivered_wins_over_a_permanent_error_on_every_channel(
    clock, due_reminders, channel
):
    """Item 8: an unexpected error after the request may have left is not 'failed' (a
    replay of a 'failed' one would send it twice without keys; with keys, a refusal after
    a call with no answer does not say the provider lacks the first)."""
    claim, row = _claim_one(clock, due_reminders, channel=channel)
    result = _transient(
        row, outcome=Outcome.PERMANENT, error="unexpected KeyError", maybe_delivered=True
    )
    verdict = reminder_verdict(result=result, reminder=row, channel=channel, now=clock.now())
    assert verdict.status == "unknown"
    reminder_record_batch(claim=claim, results=[result], clock=clock)
    assert Reminder.objects.get(pk=row.pk).status == "unknown"


@pytest.mark.django_db(transaction=True)
def test_a_cancel_committing_while_a_record_runs_is_never_lost(clock, due_reminders):
    """The cancel's transaction has updated the workshop (and skipped the ``sending`` row)
    but not committed when the worker records a transient failure. The record waits
    for the workshop row (FOR SHARE), then sees the cancel: the row ends cancelled.
    Without the lock it read 'scheduled', wrote 'pending', and the row later ended
    'missed' for a cancelled workshop."""
    claim, row = _claim_one(clock, due_reminders)
    updated, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def cancel() -> None:
        try:
            with transaction.atomic():
                Workshop.objects.filter(pk=row.workshop_id).update(status="cancelled")
                Reminder.objects.filter(
                    workshop_id=row.workshop_id, status__in=("pending", "queued")
                ).update(status="cancelled")
                updated.set()
                go.wait(10)
        except BaseException as exc:  # collected: a thread's exception is otherwise lost
            errors.append(exc)
        finally:
            connections.close_all()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    assert updated.wait(10)
    recorder_done = threading.Event()

    def record() -> None:
        try:
            reminder_record_batch(claim=claim, results=[_transient(row)], clock=clock)
        except BaseException as exc:
            errors.append(exc)
        finally:
            recorder_done.set()
            connections.close_all()

    recorder = threading.Thread(target=record)
    recorder.start()
    assert not recorder_done.wait(0.5), "the record did not wait for the cancelling transaction"
    go.set()
    canceller.join(10)
    recorder.join(10)
    assert errors == []
    assert Reminder.objects.get(pk=row.pk).status == "cancelled"
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_record_and_reaper_racing_on_the_same_rows_agree_and_never_deadlock(
    clock, due_reminders, settings
):
    """Item 9: 30 rounds of a record and the reaper hitting the same 20 claimed smtp rows at
    once, the lease just expired. Either wins whole: the reminder and its attempt agree
    (sent/sent or unknown/lease_expired); no deadlock aborts either side. Each side in
    turn is given a head start of up to 8 ms, so both are seen winning."""
    rounds, per_round = 30, 20
    winners: Counter = Counter()
    disagreements: list[tuple] = []
    for round_ in range(rounds):
        ids = due_reminders(per_round, per_workshop=per_round)
        claim = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
        results = [
            DeliveryResult(
                reminder_id=r.pk,
                key=r.key,
                outcome=Outcome.SENT,
                message_id=f"m{r.pk}",
                error="",
                attempts=1,
                provider_reached=True,
                maybe_delivered=True,
            )  # fmt: skip
            for r in claim.reminders
        ]
        clock.advance(settings.REMINDERS_LEASE_SECONDS)
        lag = (round_ % 5) * 0.002
        record = after(
            lag if round_ % 2 else 0.0,
            reminder_record_batch, claim=claim, results=results, clock=clock,
        )  # fmt: skip
        reap = after(0.0 if round_ % 2 else lag, reminders_reap, clock=clock)
        race(record, reap)
        rows = dict(Reminder.objects.filter(pk__in=ids).values_list("pk", "status"))
        attempts = dict(
            DeliveryAttempt.objects.filter(claim_token=claim.token).values_list(
                "reminder_id", "outcome"
            )
        )
        for pk in ids:
            pair = (rows[pk], attempts[pk])
            winners[pair] += 1
            if pair not in {("sent", "sent"), ("unknown", "lease_expired")}:
                disagreements.append((pk, *pair))
    print(f"\nrecord vs reaper, {rounds} rounds x {per_round}: {dict(winners)}")
    assert disagreements == []
    assert sum(winners.values()) == rounds * per_round
    assert winners[("sent", "sent")] and winners[("unknown", "lease_expired")], (
        "one side won every round: the race was never run both ways"
    )


def _sent(reminder):
    return DeliveryResult(
        reminder_id=reminder.pk, key=reminder.key, outcome=Outcome.SENT, message_id=f"m{reminder.pk}",
        error="", attempts=1, provider_reached=True, maybe_delivered=True,
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_an_all_sent_record_is_one_statement_outside_any_transaction(clock, due_reminders):
    """The common chunk (every outcome sent) is recorded by one statement in autocommit:
    no BEGIN, no COMMIT, no lock taken apart, and the rows and their attempts end sent."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement record is PostgreSQL's; SQLite records in a transaction")
    ids = due_reminders(5)
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    sent: list[tuple[bool, bool]] = []

    def capture(execute, sql, params, many, context):
        sent.append((connection.get_autocommit(), connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        counts = reminder_record_batch(
            claim=claim, results=[_sent(r) for r in claim.reminders], clock=clock
        )
    assert counts == {"sent": 5}
    assert sent == [(True, False)]
    outcomes = DeliveryAttempt.objects.filter(claim_token=claim.token).values_list(
        "outcome", flat=True
    )
    assert sorted(outcomes) == ["sent"] * 5


@pytest.mark.django_db(transaction=True)
def test_a_first_claim_is_two_statements_outside_any_transaction(clock, due_reminders):
    """On PostgreSQL the claim (take, read, open the attempts) and its text freeze are one
    statement each, in autocommit: no BEGIN, no COMMIT around them (the text already
    stored, as for every batch but a text's first; the suppressions of the addresses the
    batch read first are read by the claim's statement)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's claim is three statements in one transaction")
    first, second = due_reminders(5, per_workshop=5), due_reminders(5, per_workshop=5)
    reminder_claim_batch(ids=first, channel="smtp", clock=clock)  # stores the text
    addresses = suppression_addresses(second)
    sent: list[tuple[bool, bool]] = []

    def capture(execute, sql, params, many, context):
        sent.append((connection.get_autocommit(), connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        claim = reminder_claim_batch(ids=second, channel="smtp", clock=clock, addresses=addresses)
    assert sorted(claim.ids) == sorted(second)
    assert all(reminder.text_id for reminder in Reminder.objects.filter(pk__in=second))
    assert sent == [(True, False), (True, False)]


@pytest.mark.django_db(transaction=True)
def test_an_all_sent_record_locks_its_rows_in_id_order(clock, due_reminders):
    """Claimed in send order (the earlier deadline first), a chunk's lowest id comes last;
    the record still locks in id order, as every writer does. With the lowest row held by
    another transaction, the waiting record holds none of the others (locking in send
    order it would hold every row of the earlier workshop: a deadlock with any writer
    locking in id order)."""
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement record is PostgreSQL's; SQLite records in a transaction")
    later = due_reminders(3, per_workshop=3, starts_in=timedelta(hours=3))
    earlier = due_reminders(3, per_workshop=3, starts_in=timedelta(hours=2))
    claim = reminder_claim_batch(ids=later + earlier, channel="smtp", clock=clock)
    assert claim.ids[-1] != min(claim.ids), "the claim's order should put the lowest id late"
    lowest = min(claim.ids)
    held, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Reminder.objects.select_for_update().filter(pk=lowest).values_list("pk"))
                held.set()
                go.wait(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def record() -> None:
        try:
            results = [_sent(r) for r in claim.reminders]
            reminder_record_batch(claim=claim, results=results, clock=clock)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    recorder = threading.Thread(target=record)
    recorder.start()
    waiting = False
    for _ in range(200):  # until the record's backend waits for a row lock
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s",
                ["%locked AS MATERIALIZED%"],
            )
            waiting = cursor.fetchone()[0] == 1
        if waiting:
            break
        go.wait(0.05)
    with transaction.atomic():
        free = set(
            Reminder.objects.select_for_update(skip_locked=True)
            .filter(pk__in=claim.ids)
            .values_list("pk", flat=True)
        )
    go.set()
    holder.join(10)
    recorder.join(10)
    assert waiting, "the record never waited for the held row"
    assert errors == []
    assert free == set(claim.ids) - {lowest}
    assert set(Reminder.objects.filter(pk__in=claim.ids).values_list("status", flat=True)) == {
        "sent"
    }


@pytest.mark.django_db(transaction=True)
def test_one_key_carries_byte_identical_bodies_across_a_reaped_retry(
    live_clock, due_reminders, settings
):
    """Item 10: the body a worker sent before it died, and the one the provider gets after
    the reaper handed the reminder back minutes later, are the same bytes."""
    from delivery.channels.http import encode_body
    from loopback.http_sink import HttpSink
    from reminders.content import reminder_envelope
    from reminders.worker import pipeline

    (reminder_id,) = due_reminders(1)
    first = reminder_claim_batch(ids=[reminder_id], channel="http", clock=live_clock)
    sent_before_dying = encode_body(reminder_envelope(reminder=first.reminders[0]))
    live_clock.advance(settings.REMINDERS_LEASE_SECONDS)
    assert reminders_reap(clock=live_clock)["requeued"] == 1
    live_clock.advance(60)
    with HttpSink() as sink:
        settings.REMINDERS_HTTP_URL = sink.url
        settings.REMINDERS_HTTP_SECRET = "s3cret"
        assert pipeline.deliver([reminder_id], clock=live_clock, channel="http")["sent"] == 1
        [request] = sink.requests
    assert request.key == first.reminders[0].key
    assert request.body == sent_before_dying


# Across claims: a keyed call that got no definite answer is kept on the row
# (Reminder.maybe_sent), so every later writer that finds the row past its
# deadline says ``unknown``, not ``missed``, whichever claim it is in.


def _returned_after_a_call(clock, due_reminders, answer, **kwargs):
    """Claim a keyed reminder, record a timeout (``none``) or a 503 (``definite``): it goes
    back to ``pending`` to be tried again under its key. Return it."""
    claim, row = _claim_one(clock, due_reminders, **kwargs)
    result = _transient(row, **(_NO_ANSWER if answer == "none" else {}))
    assert reminder_record_batch(claim=claim, results=[result], clock=clock) == {"pending": 1}
    row.refresh_from_db()
    assert row.maybe_sent is (answer == "none")
    return row


def _late_by_expiry(clock, row):
    clock.advance((row.deadline_at - clock.now()).total_seconds())
    from reminders.services import reminders_settle

    assert reminders_settle(clock=clock)["missed"] == 1
    return reasons.LATE_IN_RETRY.format(error=row.last_error)


def _late_at_the_next_claim(clock, row):
    clock.advance((row.deadline_at - clock.now()).total_seconds())
    assert reminder_claim_batch(ids=[row.pk], channel="http", clock=clock).ids == []
    return reasons.LATE_AT_CLAIM


def _moved_inside_the_cutoff(clock, row):
    inside = clock.now() + timedelta(minutes=20)
    workshop_update(workshop=row.workshop, starts_at=inside, ends_at=inside + timedelta(hours=1))
    return reasons.MOVED_INSIDE_CUTOFF


def _a_503_at_the_next_claim_with_no_time_left(clock, row):
    clock.advance((row.deadline_at - clock.now()).total_seconds() - 20)
    claim = reminder_claim_batch(ids=[row.pk], channel="http", clock=clock)
    assert claim.ids == [row.pk]
    reminder_record_batch(claim=claim, results=[_transient(row)], clock=clock)
    return reasons.LATE_IN_RETRY.format(error="HTTP 503")


def _released_at_the_next_claim_past_its_deadline(clock, row):
    clock.advance((row.deadline_at - clock.now()).total_seconds() - 1)
    claim = reminder_claim_batch(ids=[row.pk], channel="http", clock=clock)
    assert claim.ids == [row.pk]
    clock.advance(2)  # a stop before the call, after the deadline
    assert reminder_release(claim=claim, clock=clock) == 1
    return reasons.LATE_AT_CLAIM


def _re_enrolled_after_the_cutoff(clock, row):
    from workshops.services import enrollment_create

    enrollment_cancel(enrollment=row.enrollment, clock=clock)
    assert Reminder.objects.get(pk=row.pk).status == "cancelled"
    clock.advance((row.deadline_at - clock.now()).total_seconds())
    enrollment_create(attendee=row.attendee, workshop=row.workshop)
    return reasons.ENROLLED_LATE


@pytest.mark.parametrize(
    "late",
    [
        _late_by_expiry,
        _late_at_the_next_claim,
        _moved_inside_the_cutoff,
        _a_503_at_the_next_claim_with_no_time_left,
        _released_at_the_next_claim_past_its_deadline,
        _re_enrolled_after_the_cutoff,
    ],
    ids=lambda late: late.__name__.strip("_").replace("_", "-"),
)
@pytest.mark.parametrize("answer", ["definite", "none"])
def test_a_keyed_reminder_that_timed_out_in_an_earlier_claim_ends_unknown_when_late(
    answer, late, clock, due_reminders
):
    """A keyed call timed out, so the reminder went back to ``pending`` with its key; later,
    in another claim or none, it is found past its deadline. After a 503 instead of the
    timeout it was never accepted: ``missed``. After the timeout the provider may hold it:
    ``unknown``, whichever writer finds it late."""
    row = _returned_after_a_call(clock, due_reminders, answer)
    why = late(clock, row)
    row.refresh_from_db()
    if answer == "definite":
        assert (row.status, row.status_reason) == ("missed", why)
    else:
        assert (row.status, row.status_reason) == (
            "unknown",
            reasons.MAYBE_SENT_NOT_RETRIED.format(why=why)[:200],
        )
        assert row.maybe_sent


def test_the_mark_outlives_a_later_definite_answer_and_reaches_the_attempt_cap(
    clock, due_reminders, settings
):
    """Timeout, then 503, then 503 at the cap: the first call may still have been accepted,
    so the cap says ``unknown``, not ``failed``."""
    settings.REMINDERS_MAX_ATTEMPTS = 3
    row = _returned_after_a_call(clock, due_reminders, "none")
    for _ in range(2):
        clock.advance((row.next_attempt_at - clock.now()).total_seconds())
        claim = reminder_claim_batch(ids=[row.pk], channel="http", clock=clock)
        assert claim.ids == [row.pk]
        reminder_record_batch(claim=claim, results=[_transient(row)], clock=clock)
        row.refresh_from_db()
        assert row.maybe_sent
    assert (row.status, row.status_reason) == (
        "unknown",
        reasons.MAYBE_SENT_NOT_RETRIED.format(
            why=reasons.GAVE_UP.format(attempts=3, error="HTTP 503")
        ),
    )


def test_the_reaper_marks_the_row_it_hands_back(clock, due_reminders, settings):
    """A lost worker may have called the provider: the requeued row carries the mark, and
    the expiry that finds it late later says ``unknown``."""
    from reminders.services import reminders_settle

    claim, row = _claim_one(clock, due_reminders)
    clock.advance(settings.REMINDERS_LEASE_SECONDS)
    assert reminders_reap(clock=clock)["requeued"] == 1
    row.refresh_from_db()
    assert (row.status, row.maybe_sent) == ("pending", True)
    clock.advance((row.deadline_at - clock.now()).total_seconds())
    assert reminders_settle(clock=clock)["missed"] == 1
    row.refresh_from_db()
    assert row.status == "unknown"
    assert row.status_reason.startswith(reasons.MAYBE_SENT_NOT_RETRIED.format(why=""))


@pytest.mark.parametrize("how", ["record", "reaper"])
def test_a_blind_channels_unknown_is_marked_too(how, clock, due_reminders, settings):
    """smtp has no keys: a call with no answer ends ``unknown`` at once, and the row keeps
    the mark, so a staff "send again" that then runs late is not called ``missed``."""
    claim, row = _claim_one(clock, due_reminders, channel="smtp")
    if how == "record":
        reminder_record_batch(claim=claim, results=[_transient(row, **_NO_ANSWER)], clock=clock)
    else:
        clock.advance(settings.REMINDERS_LEASE_SECONDS)
        reminders_reap(clock=clock)
    row.refresh_from_db()
    assert (row.status, row.maybe_sent) == ("unknown", True)


def _sent_again_by_staff_then_late(clock, row, published):
    """Staff choose "send again" for a blind channel's unknown reminder (accepting a second
    copy); it is not claimed before its deadline, and the expiry finds it late."""
    from django.contrib.auth.models import User

    from reminders.services import reminders_settle
    from reminders.services.replay import reminder_resolve_unknown

    result = reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=row.pk),
        decision="send_again",
        reason="attendee says nothing came",
        actor=User.objects.create_user("staff"),
        clock=clock,
    )
    assert (result.changed, result.queued) == (1, 1)
    assert Reminder.objects.get(pk=row.pk).status == "queued"
    clock.advance((row.deadline_at - clock.now()).total_seconds())
    assert reminders_settle(clock=clock)["missed"] == 1
    row.refresh_from_db()
    assert row.status == "unknown"  # not missed: the first call may have been accepted
    assert row.status_reason == reasons.MAYBE_SENT_NOT_RETRIED.format(
        why=reasons.LATE_IN_RETRY.format(error="timed out")  # its last error, kept on re-arm
    )


@pytest.mark.parametrize(
    "case, comes_back",
    [
        ("keyed-late", False),
        ("keyed-at-the-cap", False),
        ("blind", False),
        ("blind-sent-again-late", False),
        ("missed-after-a-definite-answer", True),
    ],
)
def test_a_later_start_plans_again_only_rows_the_provider_cannot_hold(
    case, comes_back, clock, due_reminders, settings, published
):
    """Moved later, a ``missed`` reminder whose calls all got an answer is planned again.
    One that may have reached the provider stays ``unknown`` for staff: keyed, a second
    send would carry the new start under the key of one that may hold the old start;
    blind (even one staff sent again that then ran late), it could arrive twice."""
    if case == "keyed-at-the-cap":
        settings.REMINDERS_MAX_ATTEMPTS = 1
    blind = case.startswith("blind")
    starts_in = (
        timedelta(hours=2) if case == "blind-sent-again-late" else timedelta(minutes=30, seconds=20)
    )
    claim, row = _claim_one(
        clock, due_reminders, channel="smtp" if blind else "http", starts_in=starts_in
    )
    no_answer = {} if case.startswith("missed") else _NO_ANSWER
    reminder_record_batch(claim=claim, results=[_transient(row, **no_answer)], clock=clock)
    assert Reminder.objects.get(pk=row.pk).status == ("missed" if no_answer == {} else "unknown")
    if case == "blind-sent-again-late":
        _sent_again_by_staff_then_late(clock, row, published)
    later = clock.now() + timedelta(hours=6)
    workshop_update(workshop=row.workshop, starts_at=later, ends_at=later + timedelta(hours=1))
    row.refresh_from_db()
    if comes_back:
        assert (row.status, row.status_reason) == ("pending", reasons.MOVED_LATER)
        assert row.deadline_at == ReminderPolicy.from_settings().deadline_at(later)
    else:
        assert row.status == "unknown"


@pytest.mark.parametrize("channel", ["http", "smtp"])
def test_a_refusal_after_a_call_that_got_no_answer_in_an_earlier_claim_is_unknown(
    channel, clock, due_reminders, settings, published
):
    """http: a timeout, then a 4xx at the next claim. smtp: a timeout (unknown), staff send
    it again, then a 5xx. Either way the first call may have been accepted: ``unknown``,
    not ``failed`` (which a replay would send again)."""
    if channel == "http":
        row = _returned_after_a_call(clock, due_reminders, "none")
        clock.advance((row.next_attempt_at - clock.now()).total_seconds())
    else:
        claim, row = _claim_one(clock, due_reminders, channel="smtp")
        reminder_record_batch(claim=claim, results=[_transient(row, **_NO_ANSWER)], clock=clock)
        from django.contrib.auth.models import User

        from reminders.services.replay import reminder_resolve_unknown

        reminder_resolve_unknown(
            reminders=Reminder.objects.filter(pk=row.pk), decision="send_again",
            reason="attendee says nothing came", actor=User.objects.create_user("staff"),
            clock=clock,
        )  # fmt: skip
    claim = reminder_claim_batch(ids=[row.pk], channel=channel, clock=clock)
    assert claim.ids == [row.pk]
    refusal = _transient(row, outcome=Outcome.PERMANENT, error="HTTP 422", provider_reached=True)
    assert reminder_record_batch(claim=claim, results=[refusal], clock=clock) == {"unknown": 1}
    row.refresh_from_db()
    assert row.status_reason == reasons.MAYBE_SENT_NOT_RETRIED.format(why="HTTP 422")


def test_a_missed_row_the_migration_marked_is_not_planned_again_when_moved_later(
    clock, make_workshop, enrol
):
    """Migration 0015 marks ``missed`` rows with a timed-out attempt but leaves their
    status: a later start must not plan such a row again (it may have been delivered)."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    inside = clock.now() + timedelta(minutes=10)
    workshop = workshop_update(
        workshop=workshop, starts_at=inside, ends_at=inside + timedelta(hours=1)
    )
    marked = Reminder.objects.order_by("pk").first()
    Reminder.objects.filter(pk=marked.pk).update(maybe_sent=True)  # as the backfill leaves it
    later = clock.now() + timedelta(hours=6)
    workshop_update(workshop=workshop, starts_at=later, ends_at=later + timedelta(hours=1))
    statuses = dict(Reminder.objects.values_list("pk", "status"))
    assert statuses.pop(marked.pk) == "missed"
    assert set(statuses.values()) == {"pending"}
