"""A host whose clock is off by two minutes decides leases and deadlines as the database does.

The claim stamps leases and judges the window and the deadline by the
database's clock (``STATEMENT_TIMESTAMP()``), the reaper and the scan read the
database's time, and the engine gets the seconds the database said were left,
counted on its own host's clock. Each test runs the worker's or the scan's
code with a system clock shifted by two minutes, against real PostgreSQL.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from clock import SystemClock
from reminders.models import Reminder
from reminders.services import reminder_claim_batch, reminders_reap, reminders_settle
from reminders.worker import pipeline
from workshops.models import Workshop

pytestmark = pytest.mark.django_db

SKEW = timedelta(minutes=2)


class SkewedClock(SystemClock):
    """The host's clock, off by ``offset`` (its monotonic time is unaffected)."""

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self):
        return super().now() + self.offset


def _reminder_with_deadline_in(live_clock, make_workshop, enrol, seconds: float) -> Reminder:
    cutoff = timedelta(minutes=settings.REMINDERS_CUTOFF_MINUTES)
    enrol(make_workshop(starts_in=cutoff + timedelta(seconds=seconds)))
    return Reminder.objects.get()


def test_a_worker_two_minutes_fast_sends_a_reminder_the_database_says_is_on_time(
    live_clock, outbox, make_workshop, enrol
):
    reminder = _reminder_with_deadline_in(live_clock, make_workshop, enrol, 60)
    counts = pipeline.deliver([reminder.pk], clock=SkewedClock(SKEW), channel="file")
    reminder.refresh_from_db()
    assert (reminder.status, counts.get("sent")) == ("sent", 1), reminder.status_reason
    assert len(list(outbox.glob("*.eml"))) == 1


def test_a_worker_two_minutes_slow_sends_nothing_after_the_databases_deadline(
    live_clock, outbox, make_workshop, enrol
):
    reminder = _reminder_with_deadline_in(live_clock, make_workshop, enrol, 60)
    # Its deadline is now 30 s past by the database's clock (the host thinks 90 s ahead).
    starts = SystemClock().now() + timedelta(minutes=settings.REMINDERS_CUTOFF_MINUTES, seconds=-30)
    Workshop.objects.filter(pk=reminder.workshop_id).update(
        starts_at=starts, ends_at=starts + timedelta(hours=1)
    )
    pipeline.deliver([reminder.pk], clock=SkewedClock(-SKEW), channel="file")
    reminder.refresh_from_db()
    assert reminder.status == "missed"
    assert list(outbox.glob("*.eml")) == []


def test_the_engine_counts_the_time_the_database_left_on_a_slow_hosts_clock(
    live_clock, make_workshop, enrol
):
    """A host two minutes slow: the deadline it is handed is two minutes earlier on its clock
    than the workshop's, so its checks before each call fire at the database's deadline."""
    reminder = _reminder_with_deadline_in(live_clock, make_workshop, enrol, 60)
    slow = SkewedClock(-SKEW)
    claim = reminder_claim_batch(ids=[reminder.pk], channel="file", clock=slow)
    send_by = claim.send_by[reminder.pk]
    left = (send_by - slow.now()).total_seconds()
    assert 55 < left <= 60, left
    assert abs((reminder.deadline_at - send_by) - SKEW) < timedelta(seconds=5)


def test_a_scan_on_a_host_two_minutes_fast_neither_reaps_a_live_claim_nor_marks_it_missed(
    live_clock, make_workshop, enrol
):
    reminder = _reminder_with_deadline_in(live_clock, make_workshop, enrol, 60)
    with override_settings(REMINDERS_LEASE_SECONDS=90):
        claim = reminder_claim_batch(ids=[reminder.pk], channel="file", clock=SystemClock())
    assert claim.ids == [reminder.pk]
    fast = SkewedClock(SKEW)
    assert not any(reminders_reap(clock=fast).values())
    assert reminders_settle(clock=fast)["missed"] == 0
    reminder.refresh_from_db()
    assert (reminder.status, reminder.claim_token) == ("sending", claim.token)


def test_a_scan_on_a_host_two_minutes_fast_does_not_mark_an_open_reminder_missed(
    live_clock, make_workshop, enrol
):
    reminder = _reminder_with_deadline_in(live_clock, make_workshop, enrol, 60)
    assert reminders_settle(clock=SkewedClock(SKEW))["missed"] == 0
    reminder.refresh_from_db()
    assert reminder.status == "pending"


def test_a_worker_two_minutes_fast_records_a_retry_the_database_says_has_time_for(
    live_clock, make_workshop, enrol
):
    """A 503 with 90 s left by the database: retried, where the host's clock saw no time."""
    from delivery.results import DeliveryResult, Outcome
    from reminders.services import reminder_record_batch

    reminder = _reminder_with_deadline_in(live_clock, make_workshop, enrol, 90)
    fast = SkewedClock(SKEW)
    claim = reminder_claim_batch(ids=[reminder.pk], channel="http", clock=fast)
    busy = DeliveryResult(
        reminder_id=reminder.pk, key=reminder.key, outcome=Outcome.TRANSIENT, message_id=None,
        error="HTTP 503", attempts=1, provider_reached=True, maybe_delivered=False,
    )  # fmt: skip
    reminder_record_batch(claim=claim, results=[busy], clock=fast)
    reminder.refresh_from_db()
    assert reminder.status == "pending", reminder.status_reason
    assert reminder.next_attempt_at < reminder.deadline_at
