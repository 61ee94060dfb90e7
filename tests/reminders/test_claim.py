"""The claim: one guarded UPDATE makes one worker the owner; the record is fenced by it."""

import random
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.services import (
    reasons,
    reminder_claim_batch,
    reminder_record_batch,
    reminder_release,
    reminders_reap,
)
from reminders.services._sql import array_literal
from reminders.services.watch import ClaimWatch
from tests.support.plans import explained_discards, keeping
from tests.support.races import race
from workshops.services import workshop_cancel

pytestmark = pytest.mark.django_db


def _result(reminder, outcome=Outcome.SENT, **fields):
    values = {
        "reminder_id": reminder.pk,
        "key": reminder.key,
        "outcome": outcome,
        "message_id": "msg-1" if outcome == Outcome.SENT else None,
        "error": "" if outcome == Outcome.SENT else "boom",
        "attempts": 1,
        "provider_reached": True,
        "maybe_delivered": outcome == Outcome.SENT,
    }
    values.update(fields)
    return DeliveryResult(**values)


def test_second_claim_on_a_reminder_gets_nothing(clock, due_reminders):
    ids = due_reminders(3)
    first = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    second = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    assert sorted(first.ids) == sorted(ids)
    assert second.reminders == []
    assert DeliveryAttempt.objects.count() == 3


def test_claim_records_token_lease_and_an_attempt_before_any_send(clock, due_reminders, settings):
    (reminder_id,) = due_reminders(1)
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", worker="w1", clock=clock)
    row = Reminder.objects.get(pk=reminder_id)
    assert row.status == "sending"
    assert row.claim_token == claim.token
    assert row.lease_expires_at == clock.now() + timedelta(seconds=settings.REMINDERS_LEASE_SECONDS)
    assert row.attempts == 1
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.number, attempt.outcome, attempt.worker) == (1, "in_flight", "w1")


def test_claim_refused_for_lateness_moves_the_reminder_to_missed(clock, due_reminders):
    """T1: the claim is where the deadline is enforced."""
    ids = due_reminders(2, starts_in=timedelta(hours=1))
    clock.advance(timedelta(minutes=31).total_seconds())
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    assert claim.reminders == []
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("missed", reasons.LATE_AT_CLAIM)
    }


def test_reminders_of_a_cancelled_workshop_are_never_claimed(clock, due_reminders):
    ids = due_reminders(2)
    workshop_cancel(workshop=Reminder.objects.get(pk=ids[0]).workshop)
    assert reminder_claim_batch(ids=ids, channel="smtp", clock=clock).reminders == []


def test_unknown_and_sent_ids_are_a_no_op(clock, due_reminders):
    """Bad input on the worker side: ids that do not exist or were sent change nothing."""
    ids = due_reminders(2)
    claim = reminder_claim_batch(ids=[ids[0]], channel="smtp", clock=clock)
    reminder_record_batch(claim=claim, results=[_result(claim.reminders[0])], clock=clock)
    again = reminder_claim_batch(ids=[ids[0], 999_999], channel="smtp", clock=clock)
    assert again.reminders == []
    assert Reminder.objects.get(pk=ids[0]).status == "sent"


def test_record_by_a_claimer_whose_lease_was_reaped_changes_nothing(clock, due_reminders, settings):
    (reminder_id,) = due_reminders(1)
    stale = reminder_claim_batch(ids=[reminder_id], channel="http", clock=clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)
    assert reminders_reap(clock=clock)["requeued"] == 1
    fresh = reminder_claim_batch(ids=[reminder_id], channel="http", clock=clock)
    assert fresh.ids == [reminder_id]
    failed = _result(stale.reminders[0], Outcome.PERMANENT, error="stale worker says failed")
    # Counts come from rows changed: the stale record changed none.
    assert reminder_record_batch(claim=stale, results=[failed], clock=clock) == {}
    row = Reminder.objects.get(pk=reminder_id)
    assert (row.status, row.claim_token) == ("sending", fresh.token)
    # Its attempt stays as the reaper closed it, and the fresh one stays in flight.
    outcomes = dict(DeliveryAttempt.objects.values_list("claim_token", "outcome"))
    assert outcomes == {stale.token: "lease_expired", fresh.token: "in_flight"}


def test_claim_and_record_cost_well_under_a_tenth_of_a_query_per_reminder(clock, due_reminders):
    ids = due_reminders(200)
    counts = []
    for chunk in (ids[:100], ids[100:]):
        with CaptureQueriesContext(connection) as queries:
            claim = reminder_claim_batch(ids=chunk, channel="http", clock=clock)
            reminder_record_batch(
                claim=claim, results=[_result(r) for r in claim.reminders], clock=clock
            )
        assert len(claim.reminders) == 100
        # Savepoints exist only because the test runs inside a transaction.
        counts.append(len([q for q in queries if "SAVEPOINT" not in q["sql"]]))
    print(f"\nclaim + record of 100 reminders: {counts[1]} statements ({counts[0]} for a new text)")
    # Claim (PostgreSQL): take, load and insert attempts in one statement, then
    # freeze the texts (point the rows at the stored ones, joined by digest).
    # Record: lock in id order (reminders.services.fate.claimed_locked),
    # write the rows and close the attempts. The first batch of a text also
    # stores it, then points its rows at it.
    assert counts[1] / 100 <= 0.09
    assert counts[0] == counts[1] + 2
    assert Reminder.objects.filter(status="sent").count() == 200


@pytest.mark.parametrize("chunk", [4, 100])
def test_a_claim_right_after_a_large_plan_reads_its_chunk_not_every_open_row(
    clock, due_reminders, chunk
):
    """Statistics lag a plan of thousands of rows until autovacuum's next ANALYZE, and claims
    run in that window. The claim's UPDATE then compared every open row with its chunk
    (284,950 rows thrown away for a chunk of 100, 60 ms), and the texts' lock and UPDATE each
    read every row without a text (3,000 for a chunk of 4): per chunk, so smtp's chunks of 4
    paid it 750 times for 3,000 reminders."""
    _assert_the_claim_reads_its_chunk(due_reminders(3000, per_workshop=100), clock, chunk)


@pytest.mark.django_db(transaction=True)
def test_a_claim_after_a_large_plan_into_a_table_vacuumed_empty_reads_its_chunk(
    clock, due_reminders
):
    """100,000 rows gone (rolled back here; a purge would do the same), then VACUUM: the
    table counts as empty, its indexes keep their size, the primary key's much larger than
    ``text_id``'s, where the NULLs of rows without a text share entries. Filled by a plan
    before the next ANALYZE, the texts' lock took ``text_id``'s index for the primary key:
    3,003 rows thrown away for a chunk of 4."""
    table = connection.ops.quote_name(Reminder._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (key, status, status_reason, attempts, last_error, channel, "
            "provider_message_id, created_at, updated_at, attendee_id, enrollment_id, "
            "workshop_id, maybe_sent, told_cancelled, told_join_url, told_location, "
            "told_revision) SELECT 'gone-' || g, 'sent', '', 0, '', 'http', '', now(), now(), "
            "g, g, g, false, false, '', '', 0 FROM generate_series(1, 100000) g"
        )  # foreign keys are checked at commit, which never comes
        transaction.set_rollback(True)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {table}")
    _assert_the_claim_reads_its_chunk(due_reminders(3000, per_workshop=100), clock, 4)


def _assert_the_claim_reads_its_chunk(ids: list[int], clock, chunk: int) -> None:
    reminder_claim_batch(ids=ids[:chunk], channel="http", clock=clock)  # stores the text
    statements = []
    taken, probed = ids[chunk : 2 * chunk], ids[2 * chunk : 3 * chunk]
    with connection.execute_wrapper(keeping(statements)):
        reminder_claim_batch(ids=taken, channel="http", clock=clock)
    # Explained for the next chunk, whose rows are still open.
    literal = {array_literal(taken, "bigint"): array_literal(probed, "bigint")}
    discarded = explained_discards(
        [(sql, [literal.get(p, p) for p in params]) for sql, params in statements]
    )
    # At most the chunk against itself and the statement's own few lookups.
    assert max(discarded.values()) <= chunk * chunk + 200, discarded  # claim, texts, suppressions


@pytest.mark.parametrize("outcome", [Outcome.SENT, Outcome.TRANSIENT])
@pytest.mark.parametrize("chunk", [4, 100])
def test_the_watch_and_the_record_read_their_chunk_not_every_row_other_workers_are_sending(
    clock, due_reminders, chunk, outcome
):
    """Every worker's chunks in flight are ``sending`` at once, while the statistics, taken
    before they were claimed, say almost none are. Fenced by ``status = 'sending'``, the
    watch and the record started from every sending row, the record's lock once per row of
    its chunk (6,031 rows thrown away for a chunk of 4 among 3,000)."""
    ids = due_reminders(3000, per_workshop=100)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(Reminder._meta.db_table)}")
    claim = reminder_claim_batch(ids=ids[:chunk], channel="http", clock=clock)
    for start in range(chunk, len(ids), 100):
        reminder_claim_batch(ids=ids[start : start + 100], channel="http", clock=clock)
    statements = []
    results = [_result(r, outcome, maybe_delivered=False) for r in claim.reminders]
    with connection.execute_wrapper(keeping(statements)), transaction.atomic():
        ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock).refresh()
        assert (
            sum(reminder_record_batch(claim=claim, results=results, clock=clock).values()) == chunk
        )
        transaction.set_rollback(True)  # explained below against the rows still sending
    discarded = explained_discards(statements)
    assert max(discarded.values()) <= chunk * chunk + 200, discarded


@pytest.mark.parametrize(
    ("outcome", "fields", "channel", "status"),
    [
        (Outcome.SENT, {}, "smtp", "sent"),
        (Outcome.PERMANENT, {}, "smtp", "failed"),
        (Outcome.TRANSIENT, {"maybe_delivered": False}, "smtp", "pending"),
        (Outcome.TIMED_OUT, {"maybe_delivered": True}, "smtp", "unknown"),
        (Outcome.TIMED_OUT, {"maybe_delivered": True}, "http", "pending"),
        (Outcome.CANCELLED, {"attempts": 0, "provider_reached": False}, "smtp", "pending"),
        # The engine's envelope deadline passed, but the row's current one has
        # not (the workshop moved later): the fate hands it back.
        (Outcome.EXPIRED, {"provider_reached": False, "attempts": 0}, "smtp", "pending"),
    ],
)
def test_each_delivery_outcome_moves_the_reminder_to_its_status(
    clock, due_reminders, outcome, fields, channel, status
):
    (reminder_id,) = due_reminders(1)
    claim = reminder_claim_batch(ids=[reminder_id], channel=channel, clock=clock)
    result = _result(claim.reminders[0], outcome, **fields)
    assert reminder_record_batch(claim=claim, results=[result], clock=clock) == {status: 1}
    row = Reminder.objects.get(pk=reminder_id)
    assert row.status == status
    assert row.claim_token is None and row.lease_expires_at is None
    if outcome == Outcome.CANCELLED:
        assert row.attempts == 0  # never reached the provider: not counted


def test_transient_failure_retries_with_backoff_then_gives_up_at_the_cap(
    clock, due_reminders, settings
):
    settings.REMINDERS_MAX_ATTEMPTS = 2
    (reminder_id,) = due_reminders(1, starts_in=timedelta(hours=6))
    for expected in ("pending", "failed"):
        claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
        result = _result(claim.reminders[0], Outcome.TRANSIENT, maybe_delivered=False)
        reminder_record_batch(claim=claim, results=[result], clock=clock)
        row = Reminder.objects.get(pk=reminder_id)
        assert row.status == expected
        if expected == "pending":
            assert row.next_attempt_at == clock.now() + timedelta(seconds=30)
            assert reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock).ids == []
            clock.advance(30)
    assert "gave up after 2 attempts" in Reminder.objects.get(pk=reminder_id).status_reason


def test_retry_that_would_land_past_the_deadline_is_missed(clock, due_reminders):
    """T2: the deadline passes while a send waits in backoff: missed, not sent late."""
    (reminder_id,) = due_reminders(1, starts_in=timedelta(minutes=30, seconds=20))
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
    result = _result(claim.reminders[0], Outcome.TRANSIENT, maybe_delivered=False, error="503")
    reminder_record_batch(claim=claim, results=[result], clock=clock)
    row = Reminder.objects.get(pk=reminder_id)
    assert (row.status, row.status_reason) == ("missed", "deadline passed while retrying: 503")


def test_release_hands_back_untouched_reminders_and_refunds_the_attempt(clock, due_reminders):
    ids = due_reminders(2)
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
    assert reminder_release(claim=claim, clock=clock) == 2
    assert set(Reminder.objects.values_list("status", "attempts")) == {("pending", 0)}
    assert set(DeliveryAttempt.objects.values_list("outcome", flat=True)) == {"not_started"}


@pytest.mark.django_db(transaction=True)
def test_eight_threads_racing_for_the_same_thousand_reminders_claim_each_once(clock, due_reminders):
    """D1 on PostgreSQL: concurrent claimers split the rows; none is claimed twice."""
    ids = due_reminders(1000, per_workshop=50)
    chunks = [ids[offset : offset + 50] for offset in range(0, len(ids), 50)]

    def claimer(index: int):
        def claim_all() -> list[int]:
            mine = list(chunks)
            random.Random(index).shuffle(mine)  # each thread meets the others mid-way
            got: list[int] = []
            for chunk in mine:
                got.extend(
                    reminder_claim_batch(
                        ids=chunk, channel="http", worker=f"t{index}", clock=clock
                    ).ids
                )
            return got

        return claim_all

    claimed = race(*(claimer(index) for index in range(8)))
    counts = Counter(i for per_thread in claimed for i in per_thread)
    print(
        f"\nrace: 8 threads, {len(ids)} reminders, claims per thread "
        f"{[len(c) for c in claimed]}, claimed twice or more "
        f"{sum(1 for v in counts.values() if v > 1)}"
    )
    assert sum(1 for per_thread in claimed if per_thread) >= 2, "no race: one thread took all"
    assert len(counts) == 1000
    assert set(counts.values()) == {1}
    assert DeliveryAttempt.objects.count() == 1000
    assert Reminder.objects.filter(status="sending").count() == 1000


def test_claim_after_a_refunded_attempt_numbers_the_history_on(clock, due_reminders):
    """A release refunds the attempt counter; the history still numbers 1, 2, 3."""
    (reminder_id,) = due_reminders(1)
    for _ in range(2):
        claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
        reminder_release(claim=claim, clock=clock)
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
    assert claim.ids == [reminder_id]
    assert Reminder.objects.get(pk=reminder_id).attempts == 1
    assert list(DeliveryAttempt.objects.order_by("number").values_list("number", "outcome")) == [
        (1, "not_started"),
        (2, "not_started"),
        (3, "in_flight"),
    ]
