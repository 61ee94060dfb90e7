"""Writers that meet on the same rows, with their interleaving forced by a held lock.

A third session holds the first row; the two writers are started one after
the other and each is seen blocked in PostgreSQL before the lock is let go.
Both then finish, neither is aborted as a deadlock, and the rows end as the
order of their commits says.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from reminders.models import Reminder
from reminders.services import reminder_claim_batch, reminders_reap
from tests.support.races import Step, blocked_or_done
from workshops.models import Workshop
from workshops.services import workshop_cancel, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_and_a_staff_cancel_waiting_on_the_same_row_both_finish(
    clock, make_workshop, enrol
):
    workshop = make_workshop()
    enrol(workshop, count=4)
    ids = sorted(Reminder.objects.values_list("id", flat=True))
    held, release = threading.Event(), threading.Event()

    def hold_the_first_row() -> None:
        with transaction.atomic():
            list(Reminder.objects.select_for_update().filter(pk=ids[0]))
            held.set()
            release.wait(30)

    holder = Step(hold_the_first_row)
    holder.start()
    assert held.wait(10)
    # The claim takes the rows from the last to the first id; the cancel's settle from
    # the first. Locked in id order, both wait on the held row holding nothing else.
    claim = Step(lambda: reminder_claim_batch(ids=list(reversed(ids)), channel="file", clock=clock))
    claim.start()
    blocked_or_done(claim)
    cancel = Step(lambda: workshop_cancel(workshop=Workshop.objects.get(pk=workshop.pk)))
    cancel.start()
    blocked_or_done(cancel)
    assert claim.is_alive() and cancel.is_alive(), "neither waited: the test proves nothing"
    release.set()
    holder.finish()
    taken = claim.finish()
    cancel.finish()
    connection.close()
    statuses = dict(Reminder.objects.values_list("id", "status"))
    # The claim was first in line: it took all four; the cancel then found none open
    # (the claim watch and the record decide those, tests/integration/test_staff_changes.py).
    assert sorted(taken.ids) == ids
    assert set(statuses.values()) == {"sending"}
    assert Workshop.objects.get(pk=workshop.pk).status == "cancelled"


def test_the_reaper_waits_for_a_staff_move_and_returns_the_row_under_the_new_start(
    clock, make_workshop, enrol, settings
):
    """The move holds its workshop FOR NO KEY UPDATE until it commits; the reaper reads it
    FOR SHARE. Seen blocked, then let go: the reaper hands the row back with the new
    start's fate, and neither is aborted."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop)
    (reminder_id,) = Reminder.objects.values_list("id", flat=True)
    reminder_claim_batch(ids=[reminder_id], channel="http", clock=clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)
    moved, release = threading.Event(), threading.Event()
    inside = clock.now() + timedelta(minutes=20)

    def move_and_hold() -> None:
        with transaction.atomic():
            workshop_update(
                workshop=Workshop.objects.get(pk=workshop.pk),
                starts_at=inside,
                ends_at=inside + timedelta(hours=1),
            )
            moved.set()
            release.wait(30)

    mover = Step(move_and_hold)
    mover.start()
    assert moved.wait(10)
    reaper = Step(lambda: reminders_reap(clock=clock))
    reaper.start()
    blocked_or_done(reaper)
    assert reaper.is_alive(), "the reaper did not wait for the move"
    release.set()
    mover.finish()
    assert reaper.finish() == {"requeued": 0, "unknown": 1, "cancelled": 0}
    connection.close()
    # The lost worker may have reached the provider, and the new start leaves no time.
    assert Reminder.objects.get().status == "unknown"


def test_a_plan_racing_an_erasure_neither_waits_on_the_other_and_leaves_nothing_to_send(
    clock, make_workshop, enrol, django_user_model
):
    """The scan's plan inserts the attendee's reminder and holds its transaction; the erasure
    (attendee FOR UPDATE, then its enrollment's cancel) does not see that row and does not
    wait for it; the plan then commits (its FOR KEY SHARE on the attendee no longer waits).
    The row it leaves ``pending`` in a cancelled enrollment is cancelled by the next settle."""
    from reminders.services import reminders_plan, reminders_settle
    from reminders.services.erasure import attendees_erase
    from workshops.models import Attendee

    workshop = make_workshop(starts_in=timedelta(days=2))
    (enrollment,) = enrol(workshop)
    Workshop.objects.filter(pk=workshop.pk).update(
        starts_at=clock.now() + timedelta(hours=3), ends_at=clock.now() + timedelta(hours=4)
    )
    staff = django_user_model.objects.create_user(username="eraser", is_staff=True)
    planned, release = threading.Event(), threading.Event()

    def plan_and_hold() -> None:
        with transaction.atomic():
            assert reminders_plan(clock=clock) == 1
            planned.set()
            release.wait(30)

    plan = Step(plan_and_hold)
    plan.start()
    assert planned.wait(10)
    erase = Step(
        lambda: attendees_erase(
            attendees=Attendee.objects.filter(pk=enrollment.attendee_id),
            actor=staff,
            reason="asked to be forgotten",
            clock=clock,
        )
    )
    erase.start()
    blocked_or_done(erase)
    erase.finish()  # it did not wait for the plan's open transaction
    release.set()
    plan.finish()
    connection.close()
    assert Attendee.objects.get().erased_at is not None
    assert Reminder.objects.get().status == "pending"
    assert reminders_settle(clock=clock)["cancelled"] == 1
    assert Reminder.objects.get().status_reason == "enrollment cancelled"
