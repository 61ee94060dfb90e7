"""Ask for a test of one attendee's reminder, sent to the staff member asking.

A worker sends it (reminders.worker.testsend); the attendee's reminder is untouched.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from clock import Clock, default_clock
from delivery.addresses import address_problem
from reminders import queue
from reminders.models import StaffDecision
from workshops.models import Enrollment

# Also the reminder preview's answer to an attendee not enrolled.
NOT_ENROLLED = "That attendee is not enrolled in this workshop; choose one from the list."


def reminder_send_test_request(
    *,
    workshop,
    attendee,
    actor,
    clock: Clock | None = None,
    publish_task: Callable[[int], object] | None = None,
    request_token: str | None = None,
    notice: bool = False,
) -> StaffDecision:
    """Record a test send of ``attendee``'s reminder to ``actor`` and queue it after commit.

    A ``request_token`` seen before (a form posted twice) returns that decision, queueing nothing.
    """
    clock = clock or default_clock()
    address = (actor.email or "").strip()
    problem = address_problem(address) if address else "it is empty"
    if problem is not None:
        raise ValidationError(
            f"Your user's email address cannot receive a test ({problem}); set it on your "
            "user in the admin (Users) and try again.",
            code="no_staff_address",
        )
    enrolled = Enrollment.objects.filter(workshop=workshop, attendee=attendee)
    if not notice:  # a change notice also goes to one whose enrollment was cancelled
        enrolled = enrolled.filter(status=Enrollment.Status.ACTIVE)
    if not enrolled.exists():
        raise ValidationError(NOT_ENROLLED, code="not_enrolled")
    try:
        with transaction.atomic(durable=True):
            decision = StaffDecision.record(
                request_token=request_token,
                action=StaffDecision.Action.SEND_TEST,
                state=StaffDecision.State.RUNNING,
                actor=actor,
                created_at=clock.now(),
                reason=f"test of attendee {attendee.pk}'s "
                f"{'change notice' if notice else 'reminder'}, to {address}",
                tests_notice=notice,
                selected=1,
                changed=0,
                queued=1,
                workshop_ids=[workshop.pk],
                selection_ids=[attendee.pk],
            )
            publish = publish_task or queue.publish_test
            transaction.on_commit(lambda: publish(decision.pk))
        return decision
    except IntegrityError:
        if request_token is None:
            raise
        # The same form, posted again: its first request recorded the decision.
        return StaffDecision.objects.get(request_token=request_token)
