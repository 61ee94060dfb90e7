"""Dispatch: due reminders are queued and published by id in batches, only after commit."""

import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import transaction

from clock import SystemClock
from reminders.models import Reminder
from reminders.services import reminders_dispatch
from tests.support.processes import process_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_due_reminders_are_published_in_batches_after_commit(
    clock, due_reminders, published, settings
):
    settings.REMINDERS_BATCH_SIZE = 4
    ids = due_reminders(10)
    assert reminders_dispatch(clock=clock) == 10
    assert [len(batch) for batch, _ in published] == [4, 4, 2]
    assert sorted(i for batch, _ in published for i in batch) == sorted(ids)
    assert set(Reminder.objects.values_list("status", flat=True)) == {"queued"}


def test_message_expiry_is_no_later_than_the_earliest_deadline_in_its_batch(
    clock, due_reminders, published, settings
):
    settings.REMINDERS_REQUEUE_AFTER = 24 * 3600
    due_reminders(3, starts_in=timedelta(hours=2))
    due_reminders(3, starts_in=timedelta(hours=1))
    reminders_dispatch(clock=clock)
    for batch, expires_at in published:
        earliest = min(Reminder.objects.filter(id__in=batch).values_list("deadline_at", flat=True))
        assert expires_at <= earliest


def test_live_message_is_not_published_again(clock, due_reminders, published):
    due_reminders(5)
    assert reminders_dispatch(clock=clock) == 5
    clock.advance(60)
    assert reminders_dispatch(clock=clock) == 0
    assert len(published) == 1


def test_lost_message_is_published_again_once_it_expired(clock, due_reminders, published, settings):
    """B2: after the message's expiry the scan re-enqueues the same reminders, once."""
    due_reminders(5)
    reminders_dispatch(clock=clock)
    clock.advance(settings.REMINDERS_REQUEUE_AFTER)
    assert reminders_dispatch(clock=clock) == 5
    assert reminders_dispatch(clock=clock) == 0
    assert len(published) == 2


def test_rolled_back_transaction_publishes_nothing(clock, due_reminders, published):
    """S3."""
    due_reminders(3)
    with pytest.raises(RuntimeError), transaction.atomic():
        reminders_dispatch(clock=clock)
        raise RuntimeError("roll back")
    assert published == []
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}


def test_window_not_open_and_retry_time_not_reached_are_not_dispatched(
    clock, due_reminders, published, settings
):
    ids = due_reminders(3)
    Reminder.objects.filter(id=ids[0]).update(next_attempt_at=clock.now() + timedelta(minutes=5))
    Reminder.objects.filter(id=ids[2]).update(window_opens_at=clock.now() + timedelta(minutes=5))
    assert reminders_dispatch(clock=clock) == 1
    assert published[0][0] == [ids[1]]


def test_publish_to_a_dead_broker_returns_promptly_and_loses_nothing(clock, due_reminders):
    """B1: Redis down while the scan publishes: no hang; the reminders are due at the next scan."""
    clock.advance_to(SystemClock().now())  # the child process reads the real clock
    due_reminders(3)
    script = (
        "import django; django.setup()\n"
        "from reminders.services import reminders_dispatch\n"
        "print('dispatched', reminders_dispatch())\n"
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
    assert reminders_dispatch(clock=clock, publish=lambda ids, expires: True) == 3
