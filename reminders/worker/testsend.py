"""Send the test a staff member asked for (reminders.services.testsend), on a worker.

One conditional UPDATE claims the decision before the send: a redelivered task sends nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

from django.conf import settings

from clock import Clock, default_clock
from reminders.content import notice_preview, reminder_preview
from reminders.models import StaffDecision, Suppression
from reminders.services.feedback import address_key
from reminders.worker import bridge
from workshops.models import Attendee, Enrollment, Workshop

logger = logging.getLogger(__name__)

# A test send may take this long on the worker, limiter wait included.
TEST_SEND_BUDGET = 60.0
# Written on the decision while the worker that claimed it sends.
SENDING = "sending"


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
    try:
        workshop = Workshop.objects.get(pk=decision.workshop_ids[0])
        attendee = Attendee.objects.get(pk=decision.selection_ids[0])
    except (Workshop.DoesNotExist, Attendee.DoesNotExist, IndexError):
        return False, "not sent: the workshop or the attendee no longer exists"
    address = decision.actor.email.strip() if decision.actor else ""
    no_address = False, "not sent: the staff member's user is gone or has no email address"
    if decision.tests_notice:
        # The change notice the attendee would get now.
        if not address:
            return no_address
        if not Enrollment.objects.filter(workshop=workshop, attendee=attendee).exists():
            return False, "not sent: the attendee is not enrolled in this workshop"
        preview = notice_preview
    else:
        # Judged as they are now: a test of a reminder that will not go out would mislead.
        if workshop.status != Workshop.Status.SCHEDULED:
            return False, "not sent: the workshop is cancelled, so its reminders will not go out"
        enrolled = Enrollment.objects.filter(
            workshop=workshop, attendee=attendee, status=Enrollment.Status.ACTIVE
        ).exists()
        if not enrolled:
            return False, "not sent: the attendee is no longer enrolled in this workshop"
        if not address:
            return no_address
        preview = reminder_preview
    suppression = Suppression.objects.filter(
        address_key=address_key(address), lifted_at__isnull=True
    ).first()
    if suppression is not None:  # as a reminder to it: no call
        return False, f"not sent: {suppression.refusal}; lift {address} in Suppressions first"
    now = clock.now()
    real = preview(workshop=workshop, attendee=attendee, now=now).envelope
    # The attendee's message goes to the staff member instead, marked a test.
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
