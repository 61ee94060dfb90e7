"""Send a staff member a test of one attendee's reminder, through the configured channel.

"Send me a test" on the reminder preview (the workshop admin) calls
``reminder_send_test_request``: it checks the staff member's own address, writes a
StaffDecision (action ``send_test``, state ``running``) and, after commit,
hands it to a worker (reminders.staff_tasks.send_test); the request returns
at once. The worker's ``reminder_send_test_run`` renders the preview, addresses it to
the staff member under a key of its own (``test-<decision id>``, so a
provider that deduplicates by key never confuses it with the real one),
sends it through the one sync/async crossing (reminders.bridge), and writes
the outcome on the decision.

It never reads or writes a reminder row, a delivery attempt or a sent
marker: the attendee's real reminder is sent exactly as if no test had been.
Like a reminder, a test goes out only while the workshop is scheduled and
the attendee enrolled, as they are when the worker runs it.
A redelivered task message sends nothing more: the decision is claimed by
one conditional UPDATE before the send.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from clock import Clock, default_clock
from delivery.addresses import address_problem
from reminders import bridge
from reminders.content import preview_envelope
from reminders.models import StaffDecision
from workshops.models import Enrollment

logger = logging.getLogger(__name__)

# Also the preview's answer to an attendee not enrolled (reminders/admin.py).
NOT_ENROLLED = "That attendee is not enrolled in this workshop; choose one from the list."

# A test send may take this long on the worker, limiter wait included.
TEST_SEND_BUDGET = 60.0
# Written on the decision while the worker that claimed it sends.
SENDING = "sending"


def reminder_send_test_request(
    *,
    workshop,
    attendee,
    actor,
    clock: Clock | None = None,
    publish_task: Callable[[int], object] | None = None,
) -> StaffDecision:
    """Record a test send of ``attendee``'s reminder to ``actor`` and queue it after commit.

    Raise ``ValidationError`` saying what to do when the staff member has no
    usable address or the attendee is not enrolled; nothing is recorded then.
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
        workshop=workshop, attendee=attendee, status=Enrollment.Status.ACTIVE
    ).exists()
    if not enrolled:
        raise ValidationError(NOT_ENROLLED, code="not_enrolled")
    with transaction.atomic(durable=True):
        decision = StaffDecision.objects.create(
            action=StaffDecision.Action.SEND_TEST,
            state=StaffDecision.State.RUNNING,
            actor=actor if actor.pk else None,
            actor_name=actor.get_username(),
            created_at=clock.now(),
            reason=f"test of attendee {attendee.pk}'s reminder, to {address}",
            selected=1,
            changed=0,
            queued=1,
            workshop_ids=[workshop.pk],
            selection_ids=[attendee.pk],
        )
        publish = publish_task or _publish_test_task
        transaction.on_commit(lambda: publish(decision.pk))
    return decision


def _publish_test_task(decision_id: int) -> None:
    from reminders.staff_tasks import send_test

    send_test.delay(decision_id)


def reminder_send_test_run(*, decision_id: int, clock: Clock | None = None) -> StaffDecision:
    """Send the test a decision asks for, once, and write how it ended on the decision."""
    clock = clock or default_clock()
    claimed = StaffDecision.objects.filter(
        pk=decision_id,
        action=StaffDecision.Action.SEND_TEST,
        state=StaffDecision.State.RUNNING,
        outcome="",
    ).update(outcome=SENDING)
    decision = StaffDecision.objects.select_related("actor").get(pk=decision_id)
    if not claimed:
        return decision  # sent (or being sent) by an earlier delivery of the task
    sent, outcome = _send(decision, clock=clock)
    StaffDecision.objects.filter(pk=decision_id).update(
        outcome=outcome, state=StaffDecision.State.DONE, changed=int(sent)
    )
    logger.info("Test send %s by %s: %s", decision_id, decision.actor_name, outcome)
    decision.refresh_from_db()
    return decision


def _send(decision: StaffDecision, *, clock: Clock) -> tuple[bool, str]:
    """Send the test; return whether the provider accepted it, and what to write down."""
    from workshops.models import Attendee, Workshop

    try:
        workshop = Workshop.objects.get(pk=decision.workshop_ids[0])
        attendee = Attendee.objects.get(pk=decision.selection_ids[0])
    except (Workshop.DoesNotExist, Attendee.DoesNotExist, IndexError):
        return False, "not sent: the workshop or the attendee no longer exists"
    # Judged as they are now, not as they were when the test was asked for: a
    # preview of a reminder that will never go out would mislead the tester.
    if workshop.status != Workshop.Status.SCHEDULED:
        return False, "not sent: the workshop is cancelled, so its reminders will not go out"
    enrolled = Enrollment.objects.filter(
        workshop=workshop, attendee=attendee, status=Enrollment.Status.ACTIVE
    ).exists()
    if not enrolled:
        return False, "not sent: the attendee is no longer enrolled in this workshop"
    address = decision.actor.email.strip() if decision.actor else ""
    if not address:
        return False, "not sent: the staff member's user is gone or has no email address"
    now = clock.now()
    real = preview_envelope(workshop=workshop, attendee=attendee, now=now)
    envelope = dataclasses.replace(
        real,
        reminder_id=0,
        key=f"test-{decision.pk}",
        recipient=address,
        recipient_name=decision.actor_name,
        subject=f"[Test] {real.subject}",
        deadline_at=now + timedelta(seconds=TEST_SEND_BUDGET),
        payload={**real.payload, "test": "true", "reminder_id": "0"},
    )
    [result] = bridge.deliver_envelopes(
        [envelope], channel=settings.REMINDERS_CHANNEL, clock=clock, budget=TEST_SEND_BUDGET
    )
    if result.ok:
        return True, f"sent to {address} as {result.message_id or 'the provider accepted it'}"
    return False, f"not sent ({result.outcome}): {result.error}"[:2000]
