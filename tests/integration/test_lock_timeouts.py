"""No worker or scan waits without bound behind a long transaction (reminders/locks.py).

A thread holds rows in a transaction that does not end (a staff member's
shell, a stuck request); the worker's claim gives up after its lock timeout
and hands its batch back for Celery's retry, and a scan skips the phase that
waited and runs the others. Ordered by events: each step is checked to have
returned while the lock was still held.
"""

from __future__ import annotations

import pytest
from django.db import connection

from reminders import locks
from reminders.models import Reminder
from reminders.worker import pipeline
from reminders.worker.pipeline import DatabaseUnavailable
from tests.support.races import held_rows
from workshops.models import Workshop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def as_worker(monkeypatch, settings):
    """This process's sessions as a worker's, with a short lock timeout."""
    settings.REMINDERS_WORKER_LOCK_TIMEOUT = 0.2
    monkeypatch.setitem(locks._role, "worker", True)
    connection.close()
    yield
    connection.close()


def test_a_claim_behind_a_held_row_gives_up_and_hands_its_batch_back(
    clock, due_reminders, outbox, as_worker
):
    ids = due_reminders(4)
    with held_rows(Reminder.objects.filter(pk=ids[0])) as still_held:
        with pytest.raises(DatabaseUnavailable) as caught:
            pipeline.deliver(ids, clock=clock, channel="file")
        gave_up_while_held = still_held()
    assert gave_up_while_held, "the claim waited for the transaction to end"
    assert caught.value.ids == ids and caught.value.held is not None
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}
    # Celery's retry (tasks.deliver_batch) then releases what it held and sends them.
    pipeline.deliver(ids, clock=clock, channel="file", held=caught.value.held)
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sent"}


def test_a_scan_skips_the_phase_that_waited_and_runs_the_others(
    clock, make_workshop, enrol, published, as_worker
):
    """The reaper reads each workshop FOR SHARE; a staff transaction holds one FOR UPDATE."""
    from reminders.services import reminder_claim_batch

    stuck = make_workshop()
    enrol(stuck, count=1)
    reminder_claim_batch(
        ids=list(Reminder.objects.values_list("id", flat=True)), channel="http", clock=clock
    )
    clock.advance(3600)  # its lease expired: the reaper wants the workshop row
    other = make_workshop()
    enrol(other, count=2)
    with held_rows(Workshop.objects.filter(pk=stuck.pk)) as still_held:
        counts = pipeline.scan(clock=clock)
        answered_while_held = still_held()
    assert answered_while_held
    assert counts["reap_skipped"] == 1
    assert counts["dispatched"] == 2, "the phases after the one that waited did not run"
    assert pipeline.scan(clock=clock)["reaped_requeued"] == 1


def test_a_scan_statement_past_its_timeout_skips_its_phase_however_long_the_lock_timeout(
    clock, make_workshop, enrol, published, as_worker, settings
):
    """REMINDERS_SCAN_STATEMENT_TIMEOUT bounds a scan statement on its own: with the lock
    timeout longer than the held row is held, the reaper's wait ends at the statement
    timeout, the reap is skipped and the later phases run while the row is still held."""
    from reminders.services import reminder_claim_batch

    stuck = make_workshop()
    enrol(stuck, count=1)
    reminder_claim_batch(
        ids=list(Reminder.objects.values_list("id", flat=True)), channel="http", clock=clock
    )
    clock.advance(3600)
    other = make_workshop()
    enrol(other, count=2)
    settings.REMINDERS_WORKER_LOCK_TIMEOUT = 600
    settings.REMINDERS_SCAN_STATEMENT_TIMEOUT = 1.0  # far above any statement of this scan
    connection.close()
    with held_rows(Workshop.objects.filter(pk=stuck.pk)) as still_held:
        counts = pipeline.scan(clock=clock)
        answered_while_held = still_held()
    assert answered_while_held, "the scan waited for the transaction to end"
    assert (counts["reap_skipped"], counts["dispatched"]) == (1, 2)
