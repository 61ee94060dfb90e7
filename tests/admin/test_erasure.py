"""Erase an attendee's personal data (issue 11, item 10): name and email gone everywhere
staff can read them, enrollments and unsent reminders cancelled, sent markers kept so
nothing is sent again, and one audit row with ids and counts only."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from delivery.results import Outcome
from reminders.erasure import ERASED_NAME, attendees_erase, erased_email
from reminders.models import DeliveryAttempt, Reminder, StaffDecision
from reminders.replay import reminder_resolve_unknown
from reminders.services import reminder_claim_batch, reminder_record_batch
from tests.admin.conftest import result_for
from workshops.models import Attendee, Enrollment
from workshops.services import enrollment_create

pytestmark = pytest.mark.django_db

EMAIL = "Ada.Lovelace@Example.org"
NAME = "Ada Lovelace"


@pytest.fixture
def eraser(make_staff):
    return make_staff(
        "workshops.view_attendee", "workshops.change_attendee", "workshops.erase_attendee",
        username="eraser",
    )  # fmt: skip


@pytest.fixture
def ada(clock, make_workshop, resolver):
    """Ada with a sent reminder, a failed one quoting her address, a pending one, and a
    staff note naming her."""
    from reminders.services import reminders_plan

    ada = Attendee.objects.create(name=NAME, email=EMAIL)
    workshops = [make_workshop() for _ in range(3)]
    for workshop in workshops:
        enrollment_create(attendee=ada, workshop=workshop)
    reminders_plan(clock=clock)
    sent, failed, pending = Reminder.objects.filter(attendee=ada).order_by("workshop__pk")
    for reminder, outcome, error in (
        (sent, Outcome.SENT, ""),
        (failed, Outcome.PERMANENT, f"550 5.1.1 <{EMAIL.lower()}>: mailbox unavailable"),
    ):
        claim = reminder_claim_batch(ids=[reminder.pk], channel="smtp", worker="t", clock=clock)
        [claimed] = claim.reminders
        reminder_record_batch(
            claim=claim, results=[result_for(claimed, outcome, error=error)], clock=clock
        )
    Reminder.objects.filter(pk=sent.pk).update(status="unknown")
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=sent.pk),
        decision="mark_sent",
        reason=f"{NAME} confirmed by phone",
        actor=resolver,
        clock=clock,
    )
    return ada, sent.pk, failed.pk, pending.pk


def test_erasure_removes_name_and_email_from_every_text_and_keeps_the_sent_marker(
    ada, eraser, clock
):
    attendee, sent, failed, pending = ada
    result = attendees_erase(
        attendees=Attendee.objects.filter(pk=attendee.pk),
        reason="request by email, ticket 4711",
        actor=eraser,
        clock=clock,
    )
    assert (result.erased, result.reminders_cancelled) == (1, 1)
    attendee.refresh_from_db()
    assert (attendee.name, attendee.email) == (ERASED_NAME, erased_email(attendee.pk))
    assert attendee.erased_at == clock.now()
    statuses = dict(Reminder.objects.filter(attendee=attendee).values_list("pk", "status"))
    assert statuses == {sent: "sent", failed: "failed", pending: "cancelled"}
    assert set(Enrollment.objects.filter(attendee=attendee).values_list("status", flat=True)) == {
        "cancelled"
    }
    texts = [
        *Reminder.objects.values_list("last_error", flat=True),
        *Reminder.objects.values_list("status_reason", flat=True),
        *DeliveryAttempt.objects.values_list("error", flat=True),
        *StaffDecision.objects.values_list("reason", flat=True),
    ]
    blob = "\n".join(texts).lower()
    assert EMAIL.lower() not in blob and NAME.lower() not in blob
    assert "550 5.1.1 <[erased]>: mailbox unavailable" in texts
    audit = StaffDecision.objects.get(action="erase")
    assert audit.attendee_ids == [attendee.pk] and audit.reminder_ids == [pending]
    assert "[erased] confirmed by phone" in texts


def test_an_erased_attendee_cannot_be_enrolled_again_and_nothing_is_resent(
    ada, eraser, clock, make_workshop
):
    attendee, *_ = ada
    attendees_erase(attendees=Attendee.objects.filter(pk=attendee.pk), reason="r", actor=eraser)
    attendee.refresh_from_db()
    with pytest.raises(ValidationError, match="personal data was erased"):
        enrollment_create(attendee=attendee, workshop=make_workshop())
    again = attendees_erase(
        attendees=Attendee.objects.filter(pk=attendee.pk), reason="r", actor=eraser
    )
    assert again.erased == 0
    assert StaffDecision.objects.filter(action="erase").latest("id").skipped == {
        "already_erased": 1
    }


def test_the_admin_erases_only_with_the_permission_after_a_confirmation_with_a_reason(
    ada, eraser, login, make_staff
):
    attendee, *_ = ada
    url = reverse("admin:workshops_attendee_changelist")
    data = {"action": "erase_selected", "_selected_action": [attendee.pk], "select_across": "0"}
    editor = login(make_staff("workshops.view_attendee", "workshops.change_attendee"))
    assert "erase_selected" not in editor.get(url).content.decode()
    assert editor.post(url, {**data, "post": "yes", "reason": "x"}).status_code == 403
    client = login(eraser)
    page = client.post(url, {**data, "index": "0"})
    rows = dict(page.context["effect_rows"])
    assert rows == {
        "Active enrollments that will be cancelled": 3,
        "Reminders that will be cancelled": 1,
        "Reminders already sent (kept, so never sent again)": 1,
    }
    no_reason = client.post(url, {**data, "post": "yes", "reason": ""})
    assert "This field is required." in no_reason.content.decode()
    assert Attendee.objects.get(pk=attendee.pk).name == NAME
    done = client.post(url, {**data, "post": "yes", "reason": "GDPR request"}, follow=True)
    assert [str(m) for m in done.context["messages"]] == [
        "Erased the personal data of 1 attendee; 1 reminder cancelled. The decision is recorded."
    ]
    assert Attendee.objects.get(pk=attendee.pk).name == ERASED_NAME
    assert NAME not in client.get(url).content.decode()
