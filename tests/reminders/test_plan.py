"""The plan: one set-based statement turns enrollments into reminders, idempotently."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from reminders.models import Reminder
from reminders.services import reasons, reminders_plan
from workshops.models import Enrollment, Workshop
from workshops.services import (
    enrollment_cancel,
    workshop_cancel,
    workshop_reinstate,
    workshop_update,
)

pytestmark = pytest.mark.django_db


def test_plan_creates_one_reminder_per_active_enrollment_in_one_statement(
    clock, make_workshop, enrol
):
    """After one read of the window's workshop ids, handed to the INSERT as an array, so
    its plan starts from those workshops' enrollments whatever ANALYZE sampled."""
    counts = []
    for size in (3, 30):  # the same statements at both sizes
        for _ in range(5):
            enrol(make_workshop(starts_in=timedelta(hours=30)), count=size)  # outside the lead
        enrol(make_workshop(starts_in=timedelta(hours=60)), count=2)  # still outside
        Reminder.objects.all().delete()
        clock.advance(timedelta(hours=8).total_seconds())  # now inside the 24 h lead
        with CaptureQueriesContext(connection) as queries:
            created = reminders_plan(clock=clock)
        assert created == 5 * size
        assert Reminder.objects.filter(status="pending").count() == 5 * size
        counts.append(len(queries))
        first, *_, insert = (query["sql"] for query in queries)
        assert first.startswith("SELECT") and "workshops_workshop" in first
        assert insert.startswith("INSERT INTO") and "= ANY(" in insert
        # The next size starts from nothing (reminders protect their workshop).
        Reminder.objects.all().delete()
        Enrollment.objects.all().delete()
        Workshop.objects.all().delete()
    assert counts[0] == counts[1]


def test_a_scan_plan_with_no_workshop_in_the_window_sends_only_the_read(clock, make_workshop):
    make_workshop(starts_in=timedelta(hours=60))
    with CaptureQueriesContext(connection) as queries:
        assert reminders_plan(clock=clock) == 0
    assert len(queries) == 1 and queries[0]["sql"].startswith("SELECT")


def test_second_plan_creates_nothing(clock, make_workshop, enrol):
    enrol(make_workshop(), count=4)
    assert Reminder.objects.count() == 4  # planned as the enrollments were made
    assert reminders_plan(clock=clock) == 0
    assert Reminder.objects.count() == 4


def test_window_and_deadline_come_from_the_policy(clock, make_workshop, enrol):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    enrol(workshop)
    reminder = Reminder.objects.get()
    assert reminder.deadline_at == workshop.starts_at - timedelta(minutes=30)
    assert reminder.window_opens_at == workshop.starts_at - timedelta(hours=24)
    assert reminder.key == f"rem-w{workshop.pk}-a{reminder.attendee_id}"


def test_enrolling_inside_the_cutoff_gives_missed_with_its_reason(clock, make_workshop, enrol):
    """T6: enrolling inside the cutoff gives no reminder to send, and says why."""
    workshop = make_workshop(starts_in=timedelta(minutes=20))
    enrol(workshop)
    reminder = Reminder.objects.get()
    assert (reminder.status, reminder.status_reason) == ("missed", reasons.ENROLLED_LATE)


def test_enrolling_in_a_workshop_that_started_more_than_a_lead_ago_gives_missed_with_its_reason(
    clock, make_workshop, make_attendee, enrol
):
    """Day three of a five-day course: staff see why no reminder went, as for a day-one
    enrolment; the scan still plans nothing for enrolments that old."""
    workshop = make_workshop(starts_in=timedelta(hours=3), duration=timedelta(days=5))
    clock.advance(timedelta(days=2).total_seconds())
    enrol(workshop)
    reminder = Reminder.objects.get()
    assert (reminder.status, reminder.status_reason) == ("missed", reasons.ENROLLED_LATE)
    Enrollment.objects.create(attendee=make_attendee(), workshop=workshop)  # no service
    assert reminders_plan(clock=clock) == 0


def test_workshops_beyond_the_lead_are_not_planned_yet(clock, make_workshop, enrol):
    enrol(make_workshop(starts_in=timedelta(days=7)))
    assert Reminder.objects.count() == 0


def test_cancelling_the_workshop_cancels_its_unsent_reminders(clock, make_workshop, enrol):
    """S1: a cancelled workshop leaves no reminder to send."""
    workshop = make_workshop()
    enrol(workshop, count=3)
    workshop_cancel(workshop=workshop)
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("cancelled", "workshop cancelled")
    }


def test_cancelling_an_enrollment_cancels_its_reminder(clock, make_workshop, enrol):
    """S2."""
    first, second = enrol(make_workshop(), count=2)
    enrollment_cancel(enrollment=first)
    assert Reminder.objects.get(enrollment=first).status == "cancelled"
    assert Reminder.objects.get(enrollment=second).status == "pending"


def test_moving_a_workshop_later_moves_the_deadline(clock, make_workshop, enrol):
    """T3."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop)
    workshop_update(
        workshop=workshop,
        starts_at=workshop.starts_at + timedelta(hours=2),
        ends_at=workshop.ends_at + timedelta(hours=2),
    )
    reminder = Reminder.objects.get()
    assert reminder.deadline_at == workshop.starts_at + timedelta(hours=2) - timedelta(minutes=30)
    assert reminder.status == "pending"


def test_moving_a_workshop_inside_the_cutoff_marks_reminders_missed(clock, make_workshop, enrol):
    """T4: moved earlier into the cutoff is missed, not an immediate blast."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    workshop_update(workshop=workshop, starts_at=clock.now() + timedelta(minutes=10))
    assert set(Reminder.objects.values_list("status", "status_reason")) == {
        ("missed", "workshop moved inside the cutoff")
    }


def _unplanned_enrollment(make_workshop, make_attendee, *, starts_in=timedelta(hours=3)):
    """An enrollment inserted without the service (no signal): no reminder until a scan."""
    workshop = make_workshop(starts_in=starts_in)
    return Enrollment.objects.create(attendee=make_attendee(), workshop=workshop)


def test_a_staff_change_settles_and_plans_only_its_own_rows(
    clock, make_workshop, make_attendee, enrol
):
    """Settled and planned in the staff member's transaction, which holds the row locks it
    takes until it commits: a change to one workshop or enrollment must not lock, settle or
    plan any other's rows (those wait for the scan), and an edit that moves nothing plans
    nothing."""
    from workshops.services import enrollment_create

    edited = make_workshop(starts_in=timedelta(hours=3))
    [mine] = enrol(edited)
    elsewhere = make_workshop(starts_in=timedelta(hours=3))
    enrol(elsewhere)
    Workshop.objects.filter(pk=elsewhere.pk).update(status=Workshop.Status.CANCELLED)
    unplanned = _unplanned_enrollment(make_workshop, make_attendee)

    with CaptureQueriesContext(connection) as queries:
        workshop_update(workshop=edited, title="A new title")
    planning = f'INSERT INTO "{Reminder._meta.db_table}"'
    assert not [q for q in queries if q["sql"].startswith(planning)], "a title edit planned"
    later = timedelta(hours=1)
    workshop_update(
        workshop=edited, starts_at=edited.starts_at + later, ends_at=edited.ends_at + later
    )
    enrollment_cancel(enrollment=mine)
    enrollment_create(attendee=make_attendee(), workshop=edited)

    assert Reminder.objects.get(workshop=elsewhere).status == "pending"  # left to the scan
    assert not Reminder.objects.filter(enrollment=unplanned).exists()
    planned = Reminder.objects.get(workshop=edited, status="pending")
    assert (planned.attempts, planned.channel, planned.provider_message_id) == (0, "", "")


def test_a_workshop_moved_into_the_lead_plans_its_active_enrollments_at_once(
    clock, make_workshop, make_attendee, enrol
):
    workshop = make_workshop(starts_in=timedelta(hours=30))  # beyond the 24 h lead
    active, cancelled = enrol(workshop, count=2)
    enrollment_cancel(enrollment=cancelled)
    assert not Reminder.objects.exists()

    workshop_update(workshop=workshop, starts_at=clock.now() + timedelta(hours=3))

    assert list(Reminder.objects.values_list("enrollment", "status")) == [(active.pk, "pending")]


def test_a_cancelled_workshop_gets_no_new_reminder(clock, make_workshop, make_attendee):
    """Its enrollment has none yet (inserted without the service); the cancel's plan skips it."""
    enrollment = _unplanned_enrollment(make_workshop, make_attendee)

    workshop_cancel(workshop=enrollment.workshop)

    assert not Reminder.objects.exists()


def test_creating_a_workshop_reads_and_locks_no_reminder(clock):
    """A workshop just created has no enrollment: following it costs the reminders nothing
    (the API and imports create workshops in bulk)."""
    from workshops.services import workshop_create

    with CaptureQueriesContext(connection) as queries:
        workshop_create(
            title="New",
            starts_at=clock.now() + timedelta(hours=3),
            timezone="UTC",
            duration=timedelta(hours=1),
        )

    assert not [q["sql"] for q in queries if "reminders_reminder" in q["sql"]]


def test_a_reinstated_workshop_plans_at_once_what_came_while_it_was_cancelled(
    clock, make_workshop, make_attendee
):
    """An enrollment loaded while the workshop was cancelled gets its reminder as the
    reinstatement commits, not at the next scan."""
    enrollment = _unplanned_enrollment(make_workshop, make_attendee)
    workshop_cancel(workshop=enrollment.workshop)

    workshop_reinstate(workshop=Workshop.objects.get(pk=enrollment.workshop_id))

    assert list(Reminder.objects.values_list("enrollment", "status")) == [
        (enrollment.pk, "pending")
    ]


def test_a_reminder_cancelled_with_its_workshop_names_its_enrollment_once_the_workshop_is_back(
    clock, make_workshop, enrol
):
    """Cancelled with the workshop, then the attendee's enrollment cancelled too: once the
    workshop is back on, the reason is the enrollment, not a cancel that was undone."""
    workshop = make_workshop()
    [enrollment] = enrol(workshop)
    workshop_cancel(workshop=workshop)
    enrollment_cancel(enrollment=enrollment)
    workshop_reinstate(workshop=workshop)
    reminder = Reminder.objects.get()
    assert (reminder.status, reminder.status_reason) == ("cancelled", reasons.ENROLLMENT_CANCELLED)


def test_an_edit_that_does_not_move_the_start_says_why_a_late_row_was_missed(
    clock, make_workshop, enrol
):
    """The start was moved inside the cutoff by a bulk update, not by this edit: the row is
    missed for its own reason, not "moved inside the cutoff"."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop)
    Workshop.objects.filter(pk=workshop.pk).update(starts_at=clock.now() + timedelta(minutes=20))

    workshop_update(workshop=Workshop.objects.get(pk=workshop.pk), title="A new title")

    assert Reminder.objects.get().status_reason == reasons.LATE_AT_CLAIM
