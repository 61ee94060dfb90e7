"""Each guard of the claim and the record, alone: rows where only that guard stops the UPDATE.

The services keep rows consistent (a cancel also cancels the reminders), so a
test going through them cannot tell whether the claim's own guard works.
Here every other condition allows the update and the one under test is set
behind the services' back; deleting that guard from the WHERE fails exactly
its case.
"""

import uuid
from datetime import timedelta

import pytest
from django.conf import settings

from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.services import reminder_claim_batch, reminder_record_batch, reminder_release
from workshops.models import Enrollment, Workshop

pytestmark = pytest.mark.django_db


def _only(reminder_id, case, clock):
    row = Reminder.objects.filter(pk=reminder_id)
    reminder = row.get()
    if case == "workshop_cancelled":
        Workshop.objects.filter(pk=reminder.workshop_id).update(status="cancelled")
    elif case == "enrollment_cancelled":
        Enrollment.objects.filter(pk=reminder.enrollment_id).update(status="cancelled")
    elif case == "window_not_open":
        starts = clock.now() + timedelta(minutes=settings.REMINDERS_LEAD_MINUTES + 5)
        Workshop.objects.filter(pk=reminder.workshop_id).update(
            starts_at=starts, ends_at=starts + timedelta(hours=1)
        )
    elif case == "retry_not_due":
        row.update(next_attempt_at=clock.now() + timedelta(minutes=5))
    elif case in ("sent", "failed", "sending", "unknown", "cancelled", "missed"):
        values = {"status": case}
        if case == "sending":
            values.update(claim_token=uuid.uuid4(), lease_expires_at=clock.now())
        row.update(**values)
    else:  # pragma: no cover - a typo in the parametrization
        raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "workshop_cancelled",
        "enrollment_cancelled",
        "window_not_open",
        "retry_not_due",
        "sent",
        "failed",
        "sending",
        "unknown",
        "cancelled",
        "missed",
    ],
)
def test_each_claim_guard_alone_keeps_the_row(clock, due_reminders, case):
    (reminder_id,) = due_reminders(1)
    _only(reminder_id, case, clock)
    before = Reminder.objects.get(pk=reminder_id)
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
    after = Reminder.objects.get(pk=reminder_id)
    assert claim.reminders == []
    # A row refused for a cancelled workshop or enrollment is cancelled by the refusal.
    refused_for_good = case in ("workshop_cancelled", "enrollment_cancelled")
    assert (after.status, after.claim_token, after.attempts) == (
        "cancelled" if refused_for_good else before.status,
        before.claim_token,
        before.attempts,
    )
    assert not DeliveryAttempt.objects.exists()


def test_the_deadline_guard_alone_keeps_the_row_from_the_claim(clock, due_reminders):
    """Its workshop now starts at the cutoff (by a bulk move; everything else fine): missed,
    never claimed."""
    (reminder_id,) = due_reminders(1)
    starts = clock.now() + timedelta(minutes=settings.REMINDERS_CUTOFF_MINUTES)
    Workshop.objects.filter(reminders=reminder_id).update(
        starts_at=starts, ends_at=starts + timedelta(hours=1)
    )
    assert reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock).reminders == []
    assert Reminder.objects.get(pk=reminder_id).status == "missed"


def _sent(reminder) -> DeliveryResult:
    return DeliveryResult(
        reminder_id=reminder.pk, key=reminder.key, outcome=Outcome.SENT, message_id="m1",
        error="", attempts=1, provider_reached=True, maybe_delivered=True,
    )  # fmt: skip


def test_the_record_guard_keeps_a_row_another_claim_holds(clock, due_reminders):
    """The claim's token is the whole fence: a row out of ``sending`` holds no token
    (``test_models.py::test_a_claim_token_outside_sending_is_refused_by_the_database``)."""
    (reminder_id,) = due_reminders(1)
    claim = reminder_claim_batch(ids=[reminder_id], channel="smtp", clock=clock)
    row = Reminder.objects.filter(pk=reminder_id)
    row.update(claim_token=uuid.uuid4())
    before = row.get()
    assert (
        reminder_record_batch(claim=claim, results=[_sent(claim.reminders[0])], clock=clock) == {}
    )
    assert reminder_release(claim=claim, clock=clock) == 0
    after = row.get()
    assert (after.status, after.claim_token, after.sent_at) == (
        before.status,
        before.claim_token,
        None,
    )
    assert DeliveryAttempt.objects.get().outcome == "in_flight"
