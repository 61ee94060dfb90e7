"""Cancel and reinstate workshops: confirmed with counts, reasoned, permitted, audited;
and nothing with enrollments is deleted (issue 11, item 6)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.urls import reverse

from delivery.results import Outcome
from reminders.models import Reminder, StaffDecision
from reminders.services import reasons, reminder_claim_batch, reminder_record_batch
from reminders.services.workshop_decisions import workshops_cancel, workshops_reinstate
from tests.admin.conftest import post_action
from tests.reminders.test_claim import _result
from workshops.models import Enrollment, Workshop
from workshops.services import enrollment_cancel, workshop_cancel

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/workshops/workshop/"
CANCELLER = (
    "workshops.view_workshop",
    "workshops.change_workshop",
    "reminders.view_reminder",
    "workshops.cancel_workshop",
)


@pytest.fixture
def canceller(make_staff):
    return make_staff(*CANCELLER, username="canceller")


def post(client, action, ids, **confirmation):
    return post_action(client, CHANGELIST, action, ids, **confirmation)


def statuses(workshop) -> Counter:
    return Counter(Reminder.objects.filter(workshop=workshop).values_list("status", flat=True))


def _workshop_with(make_reminders, **counts) -> Workshop:
    """One workshop holding reminders in the given statuses (one make_reminders call each)."""
    first = None
    for status, count in counts.items():
        ids = make_reminders(count, status)
        workshop = Reminder.objects.get(pk=ids[0]).workshop
        if first is None:
            first = workshop
        else:
            Reminder.objects.filter(pk__in=ids).update(workshop=first)
            Enrollment.objects.filter(workshop=workshop).update(workshop=first)
    return first


def test_cancel_shows_what_will_happen_and_changes_nothing_until_confirmed(
    login, canceller, make_reminders, make_workshop
):
    workshop = _workshop_with(make_reminders, pending=3, queued=1, sending=1, sent=2)
    already = make_workshop()
    workshop_cancel(workshop=already)
    page = post(login(canceller), "cancel_selected", [workshop.pk, already.pk])
    assert page.status_code == 200
    assert page.templates[0].name == "admin/reminders/workshop_decision_confirmation.html"
    text = page.content.decode()
    rows = dict(page.context["effect_rows"])
    assert page.context["preview"].eligible == 1 and page.context["preview"].selected == 2
    assert rows["Reminders that will be cancelled"] == 4
    assert rows["Reminders already sent (they stay sent)"] == 2
    [in_flight] = [count for label, count in rows.items() if label.startswith("Reminders being")]
    assert in_flight == 1
    assert "Skipped: already cancelled" in text
    assert 'name="reason"' in text
    assert Workshop.objects.get(pk=workshop.pk).status == "scheduled"
    assert StaffDecision.objects.count() == 0


def test_a_cancel_without_a_reason_is_asked_again_and_changes_nothing(
    login, canceller, make_reminders
):
    workshop = _workshop_with(make_reminders, pending=2)
    page = post(login(canceller), "cancel_selected", [workshop.pk], confirm=True, reason="  ")
    assert page.status_code == 200
    assert "This field is required." in page.content.decode()
    assert Workshop.objects.get(pk=workshop.pk).status == "scheduled"
    assert statuses(workshop) == {"pending": 2}
    assert StaffDecision.objects.count() == 0


def test_confirmed_cancel_cancels_unsent_reminders_keeps_sent_ones_and_is_audited(
    login, canceller, make_reminders
):
    workshop = _workshop_with(make_reminders, pending=2, queued=1, sent=1)
    unsent = list(
        Reminder.objects.filter(workshop=workshop, status__in=["pending", "queued"]).values_list(
            "pk", flat=True
        )
    )
    done = post(
        login(canceller), "cancel_selected", [workshop.pk], confirm=True, reason="venue flooded"
    )
    assert [str(m) for m in done.context["messages"]] == [
        "Cancelled 1 workshop; 3 reminders cancelled. The decision is recorded."
    ]
    assert Workshop.objects.get(pk=workshop.pk).status == "cancelled"
    assert statuses(workshop) == {"cancelled": 3, "sent": 1}
    audit = StaffDecision.objects.get()
    assert (audit.action, audit.actor_name, audit.reason) == (
        "cancel",
        "canceller",
        "venue flooded",
    )
    assert (audit.selected, audit.changed) == (1, 1)
    assert audit.workshop_ids == [workshop.pk]
    assert audit.reminder_ids == sorted(unsent)


def test_reinstating_past_the_cutoff_counts_and_marks_unknown_the_reminder_that_may_have_gone(
    login, canceller, make_reminders, clock
):
    """A reminder whose keyed call timed out before the cancel may be at the provider:
    past the cutoff, reinstating makes it ``unknown``, not ``missed``, and the confirmation
    page says so before staff confirm."""
    workshop = _workshop_with(make_reminders, pending=2)
    timed_out, answered = Reminder.objects.filter(workshop=workshop).order_by("pk")
    claim = reminder_claim_batch(ids=[timed_out.pk, answered.pk], channel="http", clock=clock)
    first, second = sorted(claim.reminders, key=lambda reminder: reminder.pk)
    reminder_record_batch(
        claim=claim,
        results=[
            _result(first, Outcome.TIMED_OUT, maybe_delivered=True),
            _result(second, Outcome.TRANSIENT),
        ],
        clock=clock,
    )
    assert statuses(workshop) == {"pending": 2}
    workshops_cancel(workshops=Workshop.objects.filter(pk=workshop.pk), reason="r", actor=canceller)
    clock.advance_to(workshop.starts_at - timedelta(minutes=10))  # past the 30-minute cutoff
    client = login(canceller)
    rows = dict(post(client, "reinstate_selected", [workshop.pk]).context["effect_rows"])
    assert rows["Cancelled reminders past the cutoff (they become missed)"] == 1
    assert (
        rows[
            "Cancelled reminders past the cutoff that may have reached the provider "
            "(they become unknown)"
        ]
        == 1
    )
    assert rows["Cancelled reminders that will be planned again"] == 0
    post(client, "reinstate_selected", [workshop.pk], confirm=True, reason="back on")
    assert Reminder.objects.get(pk=timed_out.pk).status == "unknown"
    assert Reminder.objects.get(pk=answered.pk).status == "missed"


def test_without_the_cancel_permission_the_action_is_not_offered_and_a_forged_post_is_refused(
    login, make_staff, make_reminders
):
    editor = make_staff(*CANCELLER[:3])  # may change workshops, may not cancel them
    workshop = _workshop_with(make_reminders, pending=2)
    client = login(editor)
    listing = client.get(CHANGELIST)
    assert "cancel_selected" not in listing.content.decode()
    assert "reinstate_selected" not in listing.content.decode()
    forged = post(client, "cancel_selected", [workshop.pk], confirm=True, reason="x")
    assert forged.status_code == 403
    assert Workshop.objects.get(pk=workshop.pk).status == "scheduled"
    assert StaffDecision.objects.count() == 0


def test_reinstate_plans_cancelled_reminders_again_and_keeps_sent_and_unenrolled_ones(
    login, canceller, make_reminders, clock
):
    workshop = _workshop_with(make_reminders, pending=3, sent=1)
    gone = Reminder.objects.filter(workshop=workshop, status="pending").first()
    enrollment_cancel(enrollment=gone.enrollment)
    workshops_cancel(workshops=Workshop.objects.filter(pk=workshop.pk), reason="r", actor=canceller)
    assert statuses(workshop) == {"cancelled": 3, "sent": 1}
    client = login(canceller)
    page = post(client, "reinstate_selected", [workshop.pk])
    rows = dict(page.context["effect_rows"])
    assert rows["Cancelled reminders that will be planned again"] == 2
    assert rows["Reminders whose enrollment is cancelled (they stay cancelled)"] == 1
    done = post(client, "reinstate_selected", [workshop.pk], confirm=True, reason="new venue")
    assert [str(m) for m in done.context["messages"]] == [
        "Reinstated 1 workshop; 2 reminders planned again or marked missed or unknown. "
        "The decision is recorded."
    ]
    assert Workshop.objects.get(pk=workshop.pk).status == "scheduled"
    assert statuses(workshop) == {"pending": 2, "cancelled": 1, "sent": 1}
    reopened = Reminder.objects.filter(workshop=workshop, status="pending")
    assert {r.status_reason for r in reopened} == {reasons.REINSTATED}
    assert {r.attempts for r in reopened} == {0}
    assert Reminder.objects.get(pk=gone.pk).status_reason == reasons.ENROLLMENT_CANCELLED
    audit = StaffDecision.objects.get(action="reinstate")
    assert audit.reason == "new venue" and audit.workshop_ids == [workshop.pk]
    assert audit.reminder_ids == sorted(r.pk for r in reopened)


def test_a_workshop_reinstated_past_the_cutoff_gets_missed_reminders_not_late_sends(
    canceller, make_reminders, clock, settings
):
    workshop = _workshop_with(make_reminders, pending=2)
    workshops_cancel(workshops=Workshop.objects.filter(pk=workshop.pk), reason="r", actor=canceller)
    clock.advance_to(workshop.starts_at - timedelta(minutes=settings.REMINDERS_CUTOFF_MINUTES))
    result = workshops_reinstate(
        workshops=Workshop.objects.filter(pk=workshop.pk),
        reason="back",
        actor=canceller,
        clock=clock,
    )
    assert (result.changed, result.reminders) == (1, 2)
    assert statuses(workshop) == {"missed": 2}
    assert set(
        Reminder.objects.filter(workshop=workshop).values_list("status_reason", flat=True)
    ) == {reasons.REINSTATED_LATE}


def test_audit_list_shows_workshop_decisions_with_links_and_cannot_be_edited(
    login, canceller, make_staff, make_reminders
):
    workshop = _workshop_with(make_reminders, pending=2)
    workshops_cancel(
        workshops=Workshop.objects.filter(pk=workshop.pk), reason="storm", actor=canceller
    )
    auditor = login(make_staff("reminders.view_staffdecision"))
    listing = auditor.get(reverse("admin:reminders_staffdecision_changelist"))
    assert listing.status_code == 200 and b"storm" in listing.content
    audit = StaffDecision.objects.get()
    detail = auditor.get(reverse("admin:reminders_staffdecision_change", args=[audit.pk]))
    text = detail.content.decode()
    assert f"/admin/workshops/workshop/?decision={audit.pk}" in text
    assert "2 reminders" in text
    assert (
        auditor.post(reverse("admin:reminders_staffdecision_change", args=[audit.pk])).status_code
        == 403
    )


def test_nothing_with_enrollments_can_be_deleted(admin_client, make_reminders, make_workshop):
    workshop = _workshop_with(make_reminders, pending=1)
    enrollment = Enrollment.objects.get(workshop=workshop)
    empty = make_workshop()
    for url in (
        reverse("admin:workshops_workshop_delete", args=[workshop.pk]),
        reverse("admin:workshops_enrollment_delete", args=[enrollment.pk]),
        reverse("admin:workshops_attendee_delete", args=[enrollment.attendee_id]),
    ):
        assert admin_client.get(url).status_code == 403, url
    for model in ("workshop", "enrollment", "attendee"):
        listing = admin_client.get(reverse(f"admin:workshops_{model}_changelist"))
        assert "delete_selected" not in listing.content.decode(), model
    # A workshop nobody enrolled in was a mistake, and can go.
    assert (
        admin_client.get(reverse("admin:workshops_workshop_delete", args=[empty.pk])).status_code
        == 200
    )
