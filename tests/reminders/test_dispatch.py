"""Dispatch: due reminders are queued and published by id in batches, only after commit."""

import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from clock import SystemClock
from reminders.models import Dispatch, Reminder
from reminders.services import dispatches_prune, reminders_dispatch
from tests.support.plans import counting_deletes
from tests.support.processes import process_env
from workshops.models import Workshop

pytestmark = pytest.mark.django_db(transaction=True)


def _dispatch(**kwargs):
    """Dispatch through the publisher the scan uses (the ``published`` fixture records it)."""
    from reminders import queue

    kwargs.setdefault("publish", queue.publish_batch)
    return reminders_dispatch(**kwargs)


def test_due_reminders_are_published_in_batches_after_commit(
    clock, due_reminders, published, settings
):
    settings.REMINDERS_BATCH_SIZE = 4
    ids = due_reminders(10)
    assert _dispatch(clock=clock) == 10
    assert [len(batch) for batch in published] == [4, 4, 2]
    assert sorted(i for batch in published for i in batch) == sorted(ids)
    assert set(Reminder.objects.values_list("status", flat=True)) == {"queued"}


def test_a_message_lives_while_any_of_its_reminders_can_be_sent(
    clock, due_reminders, published, settings
):
    """Its expiry is the latest deadline of its batch (or the requeue time), and every
    row of the batch is queued until that same instant."""
    settings.REMINDERS_REQUEUE_AFTER = 24 * 3600
    settings.REMINDERS_BATCH_SIZE = 6
    due_reminders(3, starts_in=timedelta(hours=2))
    due_reminders(3, starts_in=timedelta(hours=1))
    _dispatch(clock=clock)
    (batch,) = published
    deadlines = [r.deadline_at for r in Reminder.objects.filter(id__in=batch)]
    (expires_at,) = Dispatch.objects.values_list("expires_at", flat=True)
    assert expires_at == max(deadlines)
    assert set(Reminder.objects.values_list("queued_until", flat=True)) == {expires_at}


def test_a_backlog_past_the_earliest_deadline_strands_no_reminder_with_time_left(
    clock, due_reminders, published, outbox, settings
):
    """Item 6: one batch mixes deadlines 2, 4.5 and 60 minutes away, and the workers are
    busy for 3 minutes. Simulated as Celery does it: a message past its ``expires`` is
    dropped unrun; every scan queues what is due. Before the fix the message expired
    with its earliest deadline and the 4.5-minute row stayed queued until its own
    deadline: missed with minutes left."""
    from reminders.worker.pipeline import deliver, scan

    settings.REMINDERS_BATCH_SIZE = 10
    soon = due_reminders(1, starts_in=timedelta(minutes=32))
    middle = due_reminders(1, starts_in=timedelta(minutes=34, seconds=30))
    later = due_reminders(1, starts_in=timedelta(minutes=90))
    _dispatch(clock=clock)
    assert len(published) == 1
    clock.advance(180)  # the backlog
    for _ in range(4):
        waiting = list(Dispatch.objects.filter(expires_at__gt=clock.now()))
        Dispatch.objects.all().delete()
        for message in waiting:
            deliver(message.reminder_ids, clock=clock, channel="file")
        scan(clock=clock, publish=published.append)
        clock.advance(30)
    statuses = dict(Reminder.objects.values_list("id", "status"))
    assert statuses == {soon[0]: "missed", middle[0]: "sent", later[0]: "sent"}


def test_live_message_is_not_published_again(clock, due_reminders, published):
    due_reminders(5)
    assert _dispatch(clock=clock) == 5
    clock.advance(60)
    assert _dispatch(clock=clock) == 0
    assert len(published) == 1


def test_lost_message_is_published_again_once_it_expired(clock, due_reminders, published, settings):
    """B2: after the message's expiry the scan re-enqueues the same reminders, once."""
    due_reminders(5)
    _dispatch(clock=clock)
    clock.advance(settings.REMINDERS_REQUEUE_AFTER)
    assert _dispatch(clock=clock) == 5
    assert _dispatch(clock=clock) == 0
    assert len(published) == 2


def test_rolled_back_transaction_publishes_nothing(clock, due_reminders, published):
    """S3."""
    due_reminders(3)
    with pytest.raises(RuntimeError), transaction.atomic():
        _dispatch(clock=clock)
        raise RuntimeError("roll back")
    assert published == []
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}
    assert not Dispatch.objects.exists()


def test_window_not_open_and_retry_time_not_reached_are_not_dispatched(
    clock, due_reminders, published, settings
):
    ids = due_reminders(2) + due_reminders(1)
    Reminder.objects.filter(id=ids[0]).update(next_attempt_at=clock.now() + timedelta(minutes=5))
    # Its workshop moved (by bulk) to start a lead and five minutes from now.
    starts = clock.now() + timedelta(minutes=settings.REMINDERS_LEAD_MINUTES + 5)
    Workshop.objects.filter(reminders=ids[2]).update(
        starts_at=starts, ends_at=starts + timedelta(hours=1)
    )
    assert _dispatch(clock=clock) == 1
    assert published[0] == [ids[1]]


def test_publish_to_a_dead_broker_returns_promptly_and_loses_nothing(clock, due_reminders):
    """B1: Redis down while the scan publishes: no hang; the reminders are due at the next scan."""
    clock.advance_to(SystemClock().now())  # the child process reads the real clock
    due_reminders(3)
    script = (
        "import django; django.setup()\n"
        "from reminders.worker.pipeline import scan\n"
        "print('dispatched', scan()['dispatched'])\n"
    )
    real = SystemClock()
    started = real.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=process_env(CELERY_BROKER_URL="redis://127.0.0.1:1/0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = real.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "dispatched 3" in result.stdout
    assert "Could not publish a batch of 3 reminders" in result.stderr
    assert elapsed < 30
    now = SystemClock().now()
    reminders = list(Reminder.objects.all())
    assert {r.status for r in reminders} == {"queued"}
    assert all(r.queued_until <= now for r in reminders)
    clock.advance_to(now)
    assert _dispatch(clock=clock, publish=lambda ids: True) == 3


def test_each_transaction_of_the_dispatch_commits_and_publishes_its_own_rows(
    clock, due_reminders, settings, monkeypatch
):
    """A claim that meets a row being dispatched waits for one transaction of at most
    ROWS_PER_TRANSACTION rows, not for the whole dispatch (bench/scan_million.py measures
    the wait at 20,000 due rows). Seen from each publish: the rows queued so far."""
    from reminders.services import dispatch

    monkeypatch.setattr(dispatch, "ROWS_PER_TRANSACTION", 20)
    settings.REMINDERS_BATCH_SIZE = 10
    due_reminders(50)
    seen: list[tuple[int, int]] = []

    def publish(ids):
        seen.append((len(ids), Reminder.objects.filter(status="queued").count()))

    assert reminders_dispatch(clock=clock, publish=publish) == 50
    assert seen == [(10, 20), (10, 20), (10, 40), (10, 40), (10, 50)]


def test_a_transaction_of_the_dispatch_holds_whole_batches(
    clock, due_reminders, settings, monkeypatch
):
    from reminders.services import dispatch

    monkeypatch.setattr(dispatch, "ROWS_PER_TRANSACTION", 25)
    settings.REMINDERS_BATCH_SIZE = 10
    due_reminders(45)
    sizes: list[int] = []
    reminders_dispatch(clock=clock, publish=lambda ids: sizes.append(len(ids)))
    assert sizes == [10, 10, 10, 10, 5]


def test_the_dispatch_limit_holds_across_transactions(clock, due_reminders, settings, monkeypatch):
    from reminders.services import dispatch

    monkeypatch.setattr(dispatch, "ROWS_PER_TRANSACTION", 20)
    settings.REMINDERS_BATCH_SIZE = 10
    settings.REMINDERS_DISPATCH_LIMIT = 35
    due_reminders(50)
    assert reminders_dispatch(clock=clock, publish=lambda ids: None) == 35
    assert Reminder.objects.filter(status="pending").count() == 15


def test_the_settle_marks_every_late_row_one_transaction_at_a_time(
    clock, due_reminders, monkeypatch
):
    from django.test.utils import CaptureQueriesContext

    from reminders.services import reminders_settle, settle

    monkeypatch.setattr(settle, "ROWS_PER_TRANSACTION", 20)
    due_reminders(50, per_workshop=25, starts_in=timedelta(hours=1))
    clock.advance(timedelta(minutes=31).total_seconds())
    with CaptureQueriesContext(connection) as queries:
        assert reminders_settle(clock=clock)["missed"] == 50
    assert set(Reminder.objects.values_list("status", flat=True)) == {"missed"}
    updates = [q["sql"] for q in queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 3, "each transaction marks at most ROWS_PER_TRANSACTION rows"


def test_the_settle_passes_a_row_a_claim_holds_and_the_claim_marks_it(clock, due_reminders):
    """After an outage the sweep may have thousands of late rows; a claim holding one of
    them must not make the sweep wait, nor the sweep the claim. The held row is left to
    the claim, which refuses it for lateness itself."""
    import threading

    from reminders.services import reasons, reminder_claim_batch, reminders_settle

    held, *others = due_reminders(5, per_workshop=5, starts_in=timedelta(hours=1))
    clock.advance(timedelta(minutes=31).total_seconds())
    locked, release = threading.Event(), threading.Event()
    claimed: list = []

    def claimer() -> None:
        try:
            with transaction.atomic():
                list(Reminder.objects.select_for_update().filter(pk=held))
                locked.set()
                release.wait(30)
                claimed.append(reminder_claim_batch(ids=[held], channel="file", clock=clock))
        finally:
            connection.close()

    thread = threading.Thread(target=claimer)
    thread.start()
    assert locked.wait(10)
    swept: list[int] = []
    sweep = threading.Thread(target=lambda: (swept.append(reminders_settle(clock=clock)["missed"]),
                                             connection.close()))  # fmt: skip
    sweep.start()
    sweep.join(5)
    finished_while_held = not sweep.is_alive()
    release.set()
    thread.join(30)
    sweep.join(30)
    assert finished_while_held, "the settle waited for the claim's row lock"
    assert swept == [4]
    assert claimed[0].reminders == []
    row = Reminder.objects.get(pk=held)
    assert (row.status, row.status_reason) == ("missed", reasons.LATE_AT_CLAIM)
    assert set(Reminder.objects.filter(pk__in=others).values_list("status", flat=True)) == {
        "missed"
    }


def test_a_row_claimed_or_cancelled_after_the_read_is_not_queued_by_a_later_transaction(
    clock, due_reminders, settings, monkeypatch
):
    """The dispatch reads the due ids once, then locks them transaction by transaction. A
    row a worker claims, or staff cancel, in between must stay as they left it: the lock
    re-checks the due rule (on PostgreSQL the queueing UPDATE matches by id alone)."""
    from reminders.services import dispatch, reminder_claim_batch
    from workshops.services import workshop_cancel

    monkeypatch.setattr(dispatch, "ROWS_PER_TRANSACTION", 20)
    settings.REMINDERS_BATCH_SIZE = 10
    ids = due_reminders(20, per_workshop=20) + due_reminders(20, per_workshop=20)
    later = Reminder.objects.filter(pk__in=ids).order_by("workshop__starts_at", "id")[20:]
    claimed_id = later[0].pk
    cancelled_workshop = Reminder.objects.get(pk=later[5].pk).workshop
    published: list[list[int]] = []

    def publish(batch):
        if not published:  # the first transaction committed; the second has not locked yet
            assert reminder_claim_batch(ids=[claimed_id], channel="file", clock=clock).reminders
            workshop_cancel(workshop=cancelled_workshop, clock=clock)
        published.append(list(batch))

    reminders_dispatch(clock=clock, publish=publish)
    queued = {pk for batch in published for pk in batch}
    assert claimed_id not in queued
    statuses = dict(Reminder.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert statuses[claimed_id] == "sending"
    cancelled = set(
        Reminder.objects.filter(workshop=cancelled_workshop).values_list("pk", flat=True)
    )
    assert not cancelled & queued
    assert {statuses[pk] for pk in cancelled if pk != claimed_id} == {"cancelled"}
    assert queued == set(ids[:20])


def test_each_published_batch_leaves_a_record_of_its_ids_and_expiry(
    clock, due_reminders, published, settings
):
    """What the trace reads: one Dispatch per message, naming exactly its rows."""
    settings.REMINDERS_BATCH_SIZE = 4
    due_reminders(10)
    assert _dispatch(clock=clock) == 10
    records = list(Dispatch.objects.order_by("pk").values_list("reminder_ids", "expires_at"))
    assert [ids for ids, _ in records] == published
    requeue_at = clock.now() + timedelta(seconds=settings.REMINDERS_REQUEUE_AFTER)
    for ids, expires_at in records:
        deadlines = [r.deadline_at for r in Reminder.objects.filter(id__in=ids)]
        assert expires_at == min(requeue_at, max(deadlines))
    assert set(Dispatch.objects.values_list("queued_at", flat=True)) == {clock.now()}
    # A second dispatch while the messages live queues nothing and records nothing.
    assert _dispatch(clock=clock) == 0
    assert Dispatch.objects.count() == 3


def test_the_scan_prunes_dispatch_records_past_their_history_in_one_statement(
    clock, due_reminders, published, settings
):
    settings.REMINDERS_DISPATCH_HISTORY_DAYS = 2
    due_reminders(3)
    _dispatch(clock=clock)
    clock.advance(timedelta(days=1).total_seconds())
    Dispatch.objects.create(queued_at=clock.now(), expires_at=clock.now(), reminder_ids=[1])
    clock.advance(timedelta(days=1, seconds=1).total_seconds())
    with CaptureQueriesContext(connection) as one:
        assert dispatches_prune(clock=clock) == 1
    assert list(Dispatch.objects.values_list("reminder_ids", flat=True)) == [[1]]
    # Ten past their history cost the statements one did.
    Dispatch.objects.bulk_create(
        Dispatch(queued_at=clock.now(), expires_at=clock.now(), reminder_ids=[2]) for _ in range(10)
    )
    clock.advance(timedelta(days=2, seconds=1).total_seconds())
    with CaptureQueriesContext(connection) as ten:
        assert dispatches_prune(clock=clock) == 11
    assert len(ten) == len(one), [q["sql"] for q in ten]


def test_a_long_backlog_of_dispatch_records_is_pruned_in_short_statements_over_scans(
    clock, monkeypatch, settings
):
    """A history shortened (or a first prune) finds years of rows: each DELETE takes
    PRUNE_BATCH of them and one scan PRUNE_PER_SCAN, the rest going to the next scans."""
    from reminders.services import dispatch

    monkeypatch.setattr(dispatch, "PRUNE_BATCH", 3)
    monkeypatch.setattr(dispatch, "PRUNE_PER_SCAN", 6)
    old = clock.now() - timedelta(days=settings.REMINDERS_DISPATCH_HISTORY_DAYS, seconds=1)
    Dispatch.objects.bulk_create(
        Dispatch(queued_at=old, expires_at=old, reminder_ids=[n]) for n in range(8)
    )
    Dispatch.objects.create(queued_at=clock.now(), expires_at=clock.now(), reminder_ids=[9])
    deleted = []
    with connection.execute_wrapper(counting_deletes(deleted)):
        assert dispatches_prune(clock=clock) == 6
        assert dispatches_prune(clock=clock) == 2
    assert deleted == [3, 3, 2]
    assert list(Dispatch.objects.values_list("reminder_ids", flat=True)) == [[9]]
