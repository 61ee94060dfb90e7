"""One truth for time: every decision reads the workshop and enrollment as they are now.

Each case changes a workshop or enrollment by a path that leaves reminder rows
holding an older view of it: a bulk ``update()`` (a shell fix, a bulk load),
or a writer whose read of the workshop a move or a cancel overtook. The
interleavings are forced with events and by waiting until PostgreSQL shows
the other transaction blocked on a lock, never by thread timing. Whatever the
path, no provider call starts after the workshop's current cutoff, and within
one scan each row says what became of it: ``missed`` for a start now inside the
cutoff, ``cancelled`` for a cancelled workshop or enrollment.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from reminders.models import Reminder
from reminders.services import reasons, reminders_plan
from reminders.worker import pipeline
from tests.support.races import Step, blocked_or_done
from workshops.models import Enrollment, Workshop
from workshops.services import (
    attendee_get_or_create,
    enrollment_cancel,
    enrollment_create,
    workshop_cancel,
    workshop_update,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _move_inside_the_cutoff(clock, workshop_id: int) -> None:
    """Move the workshop to start 20 minutes from now: 10 minutes past its new cutoff."""
    starts = clock.now() + timedelta(minutes=20)
    workshop = Workshop.objects.get(pk=workshop_id)
    workshop_update(workshop=workshop, starts_at=starts, ends_at=starts + timedelta(hours=1))


def _deliver_everything(clock) -> None:
    """Run a worker over every reminder, whatever the rows say of themselves."""
    pipeline.deliver(list(Reminder.objects.values_list("id", flat=True)), clock=clock)


def _statuses(**filters) -> Counter:
    return Counter(Reminder.objects.filter(**filters).values_list("status", flat=True))


@pytest.fixture
def queued(clock, make_workshop, enrol, published, outbox):
    """Ten reminders of a workshop three hours away, planned and queued by a scan."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=10)
    assert pipeline.scan(clock=clock)["dispatched"] == 10
    return workshop


def test_a_bulk_move_inside_the_cutoff_sends_nothing_and_one_scan_marks_them_missed(
    clock, queued, published, outbox
):
    starts = clock.now() + timedelta(minutes=20)
    Workshop.objects.filter(pk=queued.pk).update(
        starts_at=starts, ends_at=starts + timedelta(hours=1)
    )
    for batch in published:  # the workers start and read the queued messages
        pipeline.deliver(batch, clock=clock)
    assert list(outbox.glob("*.eml")) == []
    pipeline.scan(clock=clock)
    assert _statuses() == {"missed": 10}


def test_a_bulk_move_earlier_is_dispatched_by_the_current_start(
    clock, make_workshop, enrol, published, outbox
):
    """Planned, moved by staff to three days out, then moved by bulk to an hour away: the
    next scan queues them, as the start now says, and they are sent."""
    workshop = make_workshop(starts_in=timedelta(hours=23, minutes=50))
    enrol(workshop, count=3)
    later = clock.now() + timedelta(days=3)
    workshop_update(workshop=workshop, starts_at=later, ends_at=later + timedelta(hours=1))
    assert pipeline.scan(clock=clock)["dispatched"] == 0, "outside the lead now: not due"
    Workshop.objects.filter(pk=workshop.pk).update(
        starts_at=clock.now() + timedelta(hours=1), ends_at=clock.now() + timedelta(hours=2)
    )
    assert pipeline.scan(clock=clock)["dispatched"] == 3
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    assert _statuses() == {"sent": 3}


def test_a_bulk_move_later_sends_nothing_before_the_window_opens(clock, queued, published, outbox):
    later = clock.now() + timedelta(days=3)
    Workshop.objects.filter(pk=queued.pk).update(
        starts_at=later, ends_at=later + timedelta(hours=1)
    )
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    assert list(outbox.glob("*.eml")) == []
    assert _statuses() == {"queued": 10}


@pytest.mark.parametrize("what", ["workshop", "enrollments"])
def test_a_bulk_cancel_leaves_no_row_queued_after_one_scan(clock, queued, published, what):
    if what == "workshop":
        Workshop.objects.filter(pk=queued.pk).update(status=Workshop.Status.CANCELLED)
        reason = reasons.WORKSHOP_CANCELLED
    else:
        Enrollment.objects.filter(workshop=queued).update(status=Enrollment.Status.CANCELLED)
        reason = reasons.ENROLLMENT_CANCELLED
    pipeline.scan(clock=clock)
    assert set(Reminder.objects.values_list("status", "status_reason")) == {("cancelled", reason)}


def test_a_claim_refusing_a_cancelled_workshops_rows_cancels_them(clock, queued, published):
    Workshop.objects.filter(pk=queued.pk).update(status=Workshop.Status.CANCELLED)
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("cancelled", reasons.WORKSHOP_CANCELLED)
    }


def test_a_re_enrolment_racing_a_move_inside_the_cutoff_is_not_sent(
    clock, make_workshop, enrol, published, outbox
):
    """The re-enrolment reads the workshop and revives its row; the move commits before it."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (enrollment,) = enrol(workshop)
    enrollment_cancel(enrollment=enrollment)
    _insert_then_wait_for(
        lambda: enrollment_create(attendee=enrollment.attendee, workshop=workshop),
        lambda: _move_inside_the_cutoff(clock, workshop.pk),
    )
    _deliver_everything(clock)
    assert list(outbox.glob("*.eml")) == []
    pipeline.scan(clock=clock)
    assert _statuses() == {"missed": 1}


def test_a_re_enrolment_through_a_workshop_read_before_a_cancel_ends_cancelled(
    clock, make_workshop, enrol, published, outbox
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (enrollment,) = enrol(workshop)
    enrollment_cancel(enrollment=enrollment)
    stale = Workshop.objects.get(pk=workshop.pk)
    workshop_cancel(workshop=Workshop.objects.get(pk=workshop.pk))
    # The form read the workshop while it was still scheduled; the service reads it again.
    with pytest.raises(ValidationError, match="This workshop is cancelled"):
        enrollment_create(attendee=enrollment.attendee, workshop=stale)
    _deliver_everything(clock)
    pipeline.scan(clock=clock)
    assert list(outbox.glob("*.eml")) == []
    assert _statuses() == {"cancelled": 1}


def _insert_then_wait_for(writer: Callable[[], object], other: Callable[[], object]):
    """Run ``writer`` in a transaction that commits only once ``other`` (started after the
    writer's statements) waits on a lock or is done; return both steps, finished."""
    written = threading.Event()
    holder: dict[str, Step] = {}

    def first():
        with transaction.atomic():
            writer()
            written.set()
            blocked_or_done(holder["other"])

    def second():
        assert written.wait(10)
        other()

    holder["other"] = Step(second)
    writer_step = Step(first)
    writer_step.start()
    holder["other"].start()
    writer_step.finish()
    holder["other"].finish()


def test_a_new_enrolment_racing_a_move_inside_the_cutoff_is_not_sent(
    clock, make_workshop, enrol, published, outbox
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    attendee, _ = attendee_get_or_create(email="late@example.com", name="Late")
    _insert_then_wait_for(
        lambda: enrollment_create(attendee=attendee, workshop=workshop),
        lambda: _move_inside_the_cutoff(clock, workshop.pk),
    )
    _deliver_everything(clock)
    assert list(outbox.glob("*.eml")) == []
    pipeline.scan(clock=clock)
    assert _statuses() == {"missed": 1}


def test_the_scans_plan_racing_a_move_inside_the_cutoff_sends_nothing(
    clock, make_workshop, enrol, published, outbox, settings
):
    workshop = make_workshop(starts_in=timedelta(days=2))
    enrol(workshop, count=3)
    # The workshop comes into the lead by bulk, so only the scan's plan creates its rows.
    Workshop.objects.filter(pk=workshop.pk).update(
        starts_at=clock.now() + timedelta(hours=3), ends_at=clock.now() + timedelta(hours=4)
    )
    _insert_then_wait_for(
        lambda: reminders_plan(clock=clock), lambda: _move_inside_the_cutoff(clock, workshop.pk)
    )
    assert _statuses() == {"pending": 3} or _statuses() == {"missed": 3}
    _deliver_everything(clock)
    assert list(outbox.glob("*.eml")) == []
    pipeline.scan(clock=clock)
    assert _statuses() == {"missed": 3}


def test_the_scans_plan_racing_a_cancel_leaves_the_rows_cancelled(
    clock, make_workshop, enrol, published, outbox
):
    workshop = make_workshop(starts_in=timedelta(days=2))
    enrol(workshop, count=3)
    Workshop.objects.filter(pk=workshop.pk).update(
        starts_at=clock.now() + timedelta(hours=3), ends_at=clock.now() + timedelta(hours=4)
    )
    _insert_then_wait_for(
        lambda: reminders_plan(clock=clock),
        lambda: workshop_cancel(workshop=Workshop.objects.get(pk=workshop.pk)),
    )
    pipeline.scan(clock=clock)
    _deliver_everything(clock)
    assert list(outbox.glob("*.eml")) == []
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("cancelled", reasons.WORKSHOP_CANCELLED)
    }


def test_a_missed_row_comes_back_when_a_bulk_move_gives_it_time(
    clock, make_workshop, enrol, published, outbox
):
    """FAULTS S7, decided by the scan from the current start."""
    workshop = make_workshop(starts_in=timedelta(minutes=20))
    enrol(workshop, count=2)
    pipeline.scan(clock=clock)
    assert _statuses() == {"missed": 2}
    published.clear()
    Workshop.objects.filter(pk=workshop.pk).update(
        starts_at=clock.now() + timedelta(hours=2), ends_at=clock.now() + timedelta(hours=3)
    )
    assert pipeline.scan(clock=clock)["dispatched"] == 2
    for batch in published:
        pipeline.deliver(batch, clock=clock)
    assert _statuses() == {"sent": 2}


def test_a_missed_row_of_a_cancelled_enrollment_does_not_come_back(
    clock, make_workshop, enrol, published, outbox
):
    workshop = make_workshop(starts_in=timedelta(minutes=20))
    first, second = enrol(workshop, count=2)
    pipeline.scan(clock=clock)
    Enrollment.objects.filter(pk=first.pk).update(status=Enrollment.Status.CANCELLED)
    Workshop.objects.filter(pk=workshop.pk).update(
        starts_at=clock.now() + timedelta(hours=2), ends_at=clock.now() + timedelta(hours=3)
    )
    pipeline.scan(clock=clock)
    assert Reminder.objects.get(enrollment=first).status == "missed"
    assert Reminder.objects.get(enrollment=second).status == "queued"
