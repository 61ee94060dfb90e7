"""Cancelling enrollments: permitted, previewed, reasoned and audited, as a workshop cancel
is (issue 34, item 12: a user with only change_enrollment cancelled every enrollment of a
workshop through the change form, with no reason asked and no decision recorded)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from reminders.models import Reminder, StaffDecision
from reminders.services import reminder_claim_batch
from tests.admin.conftest import post_action
from workshops.models import Enrollment

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/workshops/enrollment/"
CLERK = ("workshops.view_enrollment", "workshops.change_enrollment", "workshops.add_enrollment")


def post(client, ids, **confirmation):
    return post_action(client, CHANGELIST, "cancel_selected", ids, **confirmation)


def test_a_clerk_without_the_cancel_permission_is_refused_and_nothing_changes(
    login, make_staff, make_workshop, enrol
):
    enrollments = enrol(make_workshop(starts_in=timedelta(hours=3)), 4)
    clerk = login(make_staff(*CLERK))
    listed = clerk.get(CHANGELIST)
    assert "cancel_selected" not in listed.content.decode()
    answer = post(clerk, [e.pk for e in enrollments], confirm=True, reason="room too small")
    assert answer.status_code == 403
    assert set(Enrollment.objects.values_list("status", flat=True)) == {"active"}
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}
    assert not StaffDecision.objects.exists()


def test_a_cancel_is_previewed_needs_a_reason_and_is_recorded(
    login, make_staff, make_workshop, enrol, clock
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrollments = enrol(workshop, 4)
    in_flight = Reminder.objects.get(enrollment=enrollments[0])
    reminder_claim_batch(ids=[in_flight.pk], channel="smtp", clock=clock)
    already = enrol(make_workshop(starts_in=timedelta(hours=3)), 1)[0]
    Enrollment.objects.filter(pk=already.pk).update(status="cancelled")
    staff = make_staff(*CLERK, "workshops.cancel_enrollment", username="coordinator")
    client = login(staff)
    ids = [e.pk for e in enrollments[:3]] + [already.pk]

    page = post(client, ids)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Yes, cancel 3 enrollments" in text
    preview = page.context["preview"]
    assert (preview.selected, preview.eligible, preview.skipped) == (4, 3, {"already_cancelled": 1})
    assert preview.effects == {"to_cancel": 2, "in_flight": 1, "sent": 0, "to_tell_enrollment": 0}

    blank = post(client, ids, confirm=True, reason="   ")
    assert blank.status_code == 200 and blank.context["form"].errors
    assert Enrollment.objects.filter(status="active").count() == 4
    assert not StaffDecision.objects.exists()

    done = post(client, ids, confirm=True, reason="moved to the spring course")
    assert "Cancelled 3 enrollments; 2 reminders cancelled" in done.content.decode()
    assert Counter(
        Enrollment.objects.filter(workshop=workshop).values_list("status", flat=True)
    ) == {"cancelled": 3, "active": 1}
    statuses = dict(Reminder.objects.filter(workshop=workshop).values_list("enrollment", "status"))
    assert statuses == {
        enrollments[0].pk: "sending",  # its worker records it; no new call starts
        enrollments[1].pk: "cancelled",
        enrollments[2].pk: "cancelled",
        enrollments[3].pk: "pending",
    }
    decision = StaffDecision.objects.get()
    assert decision.action == StaffDecision.Action.CANCEL_ENROLLMENTS
    assert (decision.actor, decision.reason) == (staff, "moved to the spring course")
    assert (decision.selected, decision.changed) == (4, 3)
    assert decision.enrollment_ids == [e.pk for e in enrollments[:3]]
    assert decision.reminder_ids == sorted(
        Reminder.objects.filter(enrollment__in=enrollments[1:3]).values_list("pk", flat=True)
    )
    assert decision.skipped == {"already_cancelled": 1}


def test_enrolling_inside_the_cutoff_says_the_attendee_gets_no_reminder(
    admin_client, make_workshop, make_attendee, enrol, settings
):
    """An enrollment made (or set back to active) less than the cutoff before the start gets
    a reminder 'missed': the page said only that it was added."""
    from tests.admin.conftest import messages_of

    settings.REMINDERS_CUTOFF_MINUTES = 30
    workshop = make_workshop(starts_in=timedelta(minutes=20))
    walk_in = make_attendee()
    added = admin_client.post(
        f"{CHANGELIST}add/",
        {"attendee": walk_in.pk, "workshop": workshop.pk, "status": "active"},
        follow=True,
    )
    assert Reminder.objects.get(attendee=walk_in).status == "missed"
    warned = [m for m in messages_of(added) if "no reminder" in m]
    assert warned == [
        "This enrollment gets no reminder: the workshop starts less than the cutoff "
        "(30 minutes) from now. Tell the attendee another way."
    ]


def test_enrolling_inside_the_cutoff_on_the_workshops_page_says_so_too(
    admin_client, make_workshop, make_attendee, settings
):
    from tests.admin.conftest import messages_of
    from tests.admin.test_workshop_admin import _post_inline

    settings.REMINDERS_CUTOFF_MINUTES = 30
    workshop = make_workshop(starts_in=timedelta(minutes=20))
    people = [make_attendee(), make_attendee()]
    saved = _post_inline(admin_client, workshop, [("", p.pk, "active") for p in people])
    assert saved.status_code == 302
    assert set(Reminder.objects.values_list("status", flat=True)) == {"missed"}
    warned = [m for m in messages_of(admin_client.get(saved["Location"])) if "no reminder" in m]
    assert warned == [
        "2 enrollments get no reminder: the workshop starts less than the cutoff "
        "(30 minutes) from now. Tell the attendees another way."
    ]
