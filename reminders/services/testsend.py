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
NOT_QUEUED = (
    "The test could not be queued (the task queue is unreachable), so nothing was sent; "
    "send it again once the queue is back."
)
# The outcome of a test whose message the broker refused.
UNQUEUED = "not sent: the task queue was unreachable"


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
    A message the broker refuses ends the decision ``UNQUEUED`` and raises ValidationError.
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
    enrolled = Enrollment.objects.filter(
        workshop=workshop, attendee=attendee, attendee__erased_at__isnull=True
    )
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
            unsent = []
            transaction.on_commit(lambda: unsent.extend(_unless_published(publish, decision.pk)))
    except IntegrityError:
        if request_token is None:
            raise
        # The same form, posted again: its first request recorded the decision.
        decision = StaffDecision.objects.get(request_token=request_token)
        unsent = [decision.pk] if decision.outcome == UNQUEUED else []
    if unsent:
        raise ValidationError(NOT_QUEUED, code="not_queued")
    return decision


def _unless_published(publish: Callable[[int], object], pk: int) -> list[int]:
    """Publish the test; if the broker refused it, end its decision as not sent and return it."""
    if publish(pk) is not False:
        return []
    StaffDecision.objects.filter(pk=pk, state=StaffDecision.State.RUNNING, outcome="").update(
        state=StaffDecision.State.DONE, queued=0, outcome=UNQUEUED
    )
    return [pk]
