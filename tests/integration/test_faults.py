"""Faults around a batch, in process, with real servers: a stop mid-batch, a lost database
connection, beat coming back after a gap."""

from collections import Counter
from datetime import timedelta

import pytest
from django.db import OperationalError, connection

from clock import SystemClock
from delivery.message import key_digest
from delivery.results import Outcome
from loopback.http_sink import HttpSink
from reminders.models import DeliveryAttempt, Reminder
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_reap
from reminders.worker import pipeline
from tests.reminders.test_claim import _result
from tests.support.races import race
from workshops.services import enrollment_cancel, workshop_cancel, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def http_channel(settings):
    with HttpSink() as sink:
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL = sink.url
        settings.REMINDERS_HTTP_SECRET = "s3cret"
        yield sink


def test_budget_running_out_mid_batch_records_partial_results_and_leaves_nothing_sending(
    live_clock, due_reminders, http_channel, settings
):
    """C5: the stop lands mid-call; finished ones are recorded, the rest handed back."""
    settings.REMINDERS_CONCURRENCY = 4
    settings.REMINDERS_BATCH_BUDGET = 2
    settings.REMINDERS_CALL_TIMEOUT = 1  # the drain: shorter than the provider's 5 s
    ids = due_reminders(8)
    http_channel.configure(delay=5.0)
    counts = pipeline.deliver(ids, clock=SystemClock())
    # The first chunk of four was cut off in flight (idempotent channel: retry
    # later with the same key); the second chunk was never claimed.
    assert counts == {"skipped": 0, "pending": 4, "deferred": 4}
    assert not Reminder.objects.filter(status="sending").exists()
    assert Counter(DeliveryAttempt.objects.values_list("outcome", flat=True)) == {"cancelled": 4}

    http_channel.configure(delay=0.0)
    # The retry time passes (moved by hand: this test does not wait for it).
    Reminder.objects.filter(status="pending").update(next_attempt_at=None)
    pipeline.deliver(ids, clock=SystemClock())
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 8}
    # Count requests, not accepted keys (the sink deduplicates): the four cut off in
    # flight were sent again (inside the first batch and after it) with the same key
    # and the same bytes; the other four once.
    per_key = Counter(request.key for request in http_channel.requests)
    assert set(per_key) == set(Reminder.objects.values_list("key", flat=True))
    counts = sorted(per_key.values())
    assert counts[:4] == [1, 1, 1, 1] and min(counts[4:]) >= 2
    for key in per_key:
        assert len({request.body for request in http_channel.requests_for(key)}) == 1
    assert http_channel.stats()["accepted"] == 8  # one message per key


def test_calls_in_flight_at_the_budget_finish_in_the_drain_with_known_outcomes(
    live_clock, due_reminders, http_channel, settings
):
    """C5 on a provider slower than the budget but faster than a call timeout: all sent."""
    settings.REMINDERS_CONCURRENCY = 4
    settings.REMINDERS_BATCH_BUDGET = 2
    settings.REMINDERS_CALL_TIMEOUT = 10
    ids = due_reminders(8)
    http_channel.configure(delay=3.0)
    counts = pipeline.deliver(ids, clock=SystemClock())
    assert counts == {"skipped": 0, "sent": 4, "deferred": 4}
    assert not Reminder.objects.filter(status="sending").exists()


def test_database_connection_lost_between_claim_and_record_sends_nothing_twice(
    live_clock, due_reminders, settings
):
    """C7: the record fails; the lease holds the row; the reaper decides, no second claim."""
    ids = due_reminders(3)
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=live_clock)
    _terminate_my_connection()
    with pytest.raises(OperationalError):
        reminder_record_batch(
            claim=claim, results=[_result(r) for r in claim.reminders], clock=live_clock
        )
    connection.close()  # Django reconnects on the next query
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sending"}
    assert reminder_claim_batch(ids=ids, channel="smtp", clock=live_clock).reminders == []
    live_clock.advance(settings.REMINDERS_LEASE_SECONDS)
    assert reminders_reap(clock=live_clock)["unknown"] == 3


def test_beat_back_after_ten_minutes_catches_up_once(clock, due_reminders, published):
    """T7: no scan for ten minutes; the first scan after it queues everything due, once."""
    due_reminders(12, starts_in=timedelta(hours=2))
    Reminder.objects.update(status="pending")
    clock.advance(600)
    first = pipeline.scan(clock=clock)
    second = pipeline.scan(clock=clock)
    assert (first["dispatched"], second["dispatched"]) == (12, 0)
    assert sum(len(batch) for batch in published) == 12


def _terminate_my_connection() -> None:
    """Kill this process's database session from another one, as a restart would."""
    from django.db import connections

    pid = connection.connection.info.backend_pid
    other = connections.create_connection("default")
    with other.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    other.close()


def test_record_retries_through_a_lost_connection_and_keeps_known_outcomes(
    live_clock, due_reminders
):
    """C7, improved: outcomes already known are recorded once the database answers again."""
    ids = due_reminders(3)
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=live_clock)
    _terminate_my_connection()
    counts = pipeline.record_with_retry(
        claim=claim, results=[_result(r) for r in claim.reminders], clock=live_clock
    )
    assert counts == {"sent": 3}
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sent"}


def _cancel_the_workshop(workshop, reminders, clock):
    workshop_cancel(workshop=workshop, clock=clock)


def _cancel_two_enrollments(workshop, reminders, clock):
    # One whose call was answered "sent", one whose call failed and would be retried.
    for reminder in (reminders[0], reminders[2]):
        enrollment_cancel(enrollment=reminder.enrollment, clock=clock)


def _move_inside_the_cutoff(workshop, reminders, clock):
    starts = clock.now() + timedelta(minutes=20)
    workshop_update(workshop=workshop, starts_at=starts, ends_at=starts + timedelta(hours=1))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # The status of each of the four, in id order: two answered "sent", two to retry.
        (_cancel_the_workshop, ["sent", "sent", "cancelled", "cancelled"]),
        (_cancel_two_enrollments, ["sent", "sent", "cancelled", "pending"]),
        (_move_inside_the_cutoff, ["sent", "sent", "missed", "missed"]),
    ],
    ids=["workshop-cancelled", "enrollments-cancelled", "moved-inside-the-cutoff"],
)
def test_a_staff_change_between_the_records_tries_decides_the_unsent(
    live_clock, due_reminders, monkeypatch, change, expected
):
    """In flight between two tries of the record (the database went away after the
    calls; record_with_retry waits before trying again): a change staff commit in that
    wait decides the reminders whose call was not answered "sent", as the fate reads
    the workshop and enrollment when the record runs, not when the calls ended."""
    ids = due_reminders(4)
    claim = reminder_claim_batch(ids=ids, channel="http", clock=live_clock)
    reminders = sorted(claim.reminders, key=lambda reminder: reminder.pk)
    workshop = Reminder.objects.get(pk=ids[0]).workshop
    results = [
        _result(reminders[0]),
        _result(reminders[1]),
        _result(reminders[2], outcome=Outcome.TRANSIENT, error="503 busy"),
        _result(reminders[3], outcome=Outcome.TRANSIENT, error="503 busy"),
    ]
    waits = []
    sleep = live_clock.sleep_blocking

    def staff_change_in_the_wait(seconds):
        if not waits:
            race(lambda: change(workshop, reminders, live_clock))  # its own connection
        waits.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(live_clock, "sleep_blocking", staff_change_in_the_wait)
    _terminate_my_connection()
    pipeline.record_with_retry(claim=claim, results=results, clock=live_clock)
    assert len(waits) == 1, "the first try of the record should have failed"
    statuses = dict(Reminder.objects.values_list("pk", "status"))
    assert [statuses[reminder.pk] for reminder in reminders] == expected
    assert not DeliveryAttempt.objects.filter(outcome="in_flight").exists()


@pytest.mark.parametrize("chunks", [1, 2])
def test_claim_without_a_database_hands_the_whole_batch_back_for_a_retry(
    live_clock, due_reminders, outbox, settings, chunks
):
    """With one chunk the claim meets the dead connection; with two, the batch's read of its
    addresses does, before any claim."""
    settings.REMINDERS_CONCURRENCY = 3 if chunks == 1 else 2
    ids = due_reminders(3)
    connection.ensure_connection()
    _terminate_my_connection()
    with pytest.raises(pipeline.DatabaseUnavailable) as caught:
        pipeline.deliver(ids, clock=live_clock)
    assert caught.value.ids == ids
    connection.close()
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}
    assert pipeline.deliver(ids, clock=live_clock, held=caught.value.held)["sent"] == 3


def _claim_then_die(execute, sql, params, many, context):
    """Run the claim's statement (in autocommit: it commits), then lose its answer."""
    result = execute(sql, params, many, context)
    if "taken AS (UPDATE" in sql:
        # What Django raises for psycopg's error as the connection goes.
        raise OperationalError("server closed the connection unexpectedly")
    return result


def test_a_claim_committed_as_the_connection_died_is_released_by_the_retry(
    live_clock, due_reminders, outbox
):
    """The server runs the claim's statement (in autocommit: it commits), then the session
    dies before its answer arrives: the batch is handed back for a retry, which first
    releases that claim by its token, so its rows are sent now instead of waiting
    ``sending`` for their lease."""
    ids = due_reminders(3)
    with connection.execute_wrapper(_claim_then_die):
        with pytest.raises(pipeline.DatabaseUnavailable) as caught:
            pipeline.deliver(ids, clock=live_clock)
    token, chunk = caught.value.held
    assert caught.value.ids == ids and chunk == ids
    rows = set(Reminder.objects.values_list("status", "claim_token"))
    assert rows == {("sending", token)}  # what a retry without the token could not take

    assert pipeline.deliver(ids, clock=live_clock, held=caught.value.held)["sent"] == 3
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sent"}
    assert Counter(DeliveryAttempt.objects.values_list("outcome", flat=True)) == {
        "not_started": 3,
        "sent": 3,
    }
    # Each reminder's message is on disk. The file channel names a file by its key, so a
    # second send would overwrite, not add: the attempts above are what count sends.
    keys = Reminder.objects.values_list("key", flat=True)
    assert {path.name for path in outbox.glob("*.eml")} == {f"{key_digest(k)}.eml" for k in keys}


def test_a_retry_whose_release_meets_the_database_still_gone_hands_the_claim_on_again(
    live_clock, due_reminders, outbox
):
    """The retry's first step, releasing the claim cut off from the database, fails as well:
    that retry is handed back with the same ids and the same claim, so the next one still
    releases it, and the rows are sent now rather than after their lease."""
    ids = due_reminders(3)
    with connection.execute_wrapper(_claim_then_die):
        with pytest.raises(pipeline.DatabaseUnavailable) as first:
            pipeline.deliver(ids, clock=live_clock)
    connection.ensure_connection()
    _terminate_my_connection()
    with pytest.raises(pipeline.DatabaseUnavailable) as second:
        pipeline.deliver(ids, clock=live_clock, held=first.value.held)
    assert (second.value.ids, second.value.held) == (ids, first.value.held)
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sending"}
    assert pipeline.deliver(ids, clock=live_clock, held=second.value.held)["sent"] == 3


@pytest.mark.parametrize("attempts", [1, 3])
def test_a_busy_provider_gets_engine_attempts_calls_per_batch_then_the_row_waits(
    live_clock, due_reminders, http_channel, settings, attempts
):
    """REMINDERS_ENGINE_ATTEMPTS calls inside one batch, with backoff between; then the row
    is pending again, to be retried by a later batch after its retry time."""
    settings.REMINDERS_ENGINE_ATTEMPTS = attempts
    [pk] = due_reminders(1)
    key = Reminder.objects.get(pk=pk).key
    http_channel.script(key, *[503] * 5)
    counts = pipeline.deliver([pk], clock=SystemClock())
    assert len(http_channel.requests_for(key)) == attempts
    assert counts == {"skipped": 0, "pending": 1}
    row = Reminder.objects.get(pk=pk)
    assert row.status == "pending" and row.next_attempt_at is not None


@pytest.fixture
def read_only():
    """Yield a function that makes the test database read-only, as a failover's standby is
    until it is promoted (this session at once, a new one by the database's default), and
    returns the function that makes it writable again (run at the end in any case)."""
    from django.db import connections

    name = connection.settings_dict["NAME"]
    admin = connections.create_connection("default")

    def writable():
        with admin.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')

    def make_read_only():
        with admin.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = on")
        return writable

    try:
        yield make_read_only
    finally:
        writable()
        admin.close()
        connection.close()


def test_record_retries_while_the_database_is_read_only_and_keeps_known_outcomes(
    live_clock, due_reminders, monkeypatch, read_only
):
    """A failover: the worker's session reaches a standby that refuses writes (25006) until
    it is promoted. The record waits for it as for a lost connection, fenced, rather than
    leave known outcomes to the lease (``unknown`` on smtp)."""
    ids = due_reminders(3)
    claim = reminder_claim_batch(ids=ids, channel="smtp", clock=live_clock)
    writable = read_only()
    waits = []
    sleep = live_clock.sleep_blocking

    def promoted_in_the_wait(seconds):
        if not waits:
            writable()
        waits.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(live_clock, "sleep_blocking", promoted_in_the_wait)
    counts = pipeline.record_with_retry(
        claim=claim, results=[_result(r) for r in claim.reminders], clock=live_clock
    )
    assert counts == {"sent": 3} and len(waits) == 1
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sent"}


def test_claim_on_a_read_only_database_hands_the_whole_batch_back_for_a_retry(
    live_clock, due_reminders, outbox, read_only
):
    """Nothing can be claimed on a standby: the batch goes back to Celery for a retry, as
    when the database is away, and the retry sends it once the database takes writes."""
    ids = due_reminders(3)
    writable = read_only()
    with pytest.raises(pipeline.DatabaseUnavailable) as caught:
        pipeline.deliver(ids, clock=live_clock)
    assert caught.value.ids == ids
    writable()
    connection.close()
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}
    assert pipeline.deliver(ids, clock=live_clock, held=caught.value.held)["sent"] == 3


def test_a_batch_handed_back_for_a_retry_logs_why(live_clock, due_reminders, read_only, caplog):
    """The worker's line for a retry names the database's error (here a standby refusing
    writes), so an operator knows whether to look at the network, a failover or locks."""
    from celery.exceptions import Retry

    from reminders.tasks import deliver_batch

    ids = due_reminders(2)
    read_only()
    with pytest.raises((Retry, pipeline.DatabaseUnavailable)):
        deliver_batch.run(ids)
    line = next(r.getMessage() for r in caplog.records if "retrying" in r.getMessage())
    assert "read-only transaction" in line, line


def test_a_staff_task_waits_out_a_read_only_database_as_a_lost_one(
    read_only, live_clock, monkeypatch
):
    """A test send, like a delivery batch, retries while a failover's standby refuses writes
    (25006), and goes through once it is promoted, instead of failing and leaving the staff
    member's decision running."""
    from reminders import tasks
    from reminders.models import StaffDecision

    decision = StaffDecision.objects.create(
        action=StaffDecision.Action.SEND_TEST,
        state=StaffDecision.State.RUNNING,
        actor_name="tester",
        created_at=live_clock.now(),
        selected=1,
        changed=0,
        workshop_ids=[10**9],
        selection_ids=[10**9],
    )
    runs = []
    run = tasks.reminder_send_test_run

    def promoted_before_the_retry(**kwargs):
        runs.append(kwargs)
        if len(runs) == 2:
            writable()
            connection.close()
        return run(**kwargs)

    monkeypatch.setattr(tasks, "reminder_send_test_run", promoted_before_the_retry)
    writable = read_only()
    result = tasks.send_test.apply(args=[decision.pk])
    assert result.successful(), result.traceback
    assert len(runs) == 2
    decision.refresh_from_db()
    assert (decision.state, decision.outcome) == (
        "done",
        "not sent: the workshop or the attendee no longer exists",
    )


@pytest.mark.parametrize("name", ["send_test", "replay_selection", "deliver_notices"])
def test_every_task_retried_on_database_errors_counts_a_read_only_one_among_them(name):
    from django.db import InternalError

    from reminders import tasks

    assert issubclass(InternalError, getattr(tasks, name).autoretry_for)
