"""Staff cancel a workshop with a confirmation and a reason, reinstate it, and read both
decisions in the audit list, in a real browser (issue 11, items 6 and 9)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission

from reminders.models import Reminder, StaffDecision
from tests.browser.conftest import PASSWORD, log_in
from workshops.models import Workshop

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.django_db(transaction=True),
]

CHANGELIST = "/admin/workshops/workshop/"


def _choose(page, action_label: str) -> None:
    page.check("#action-toggle")
    page.select_option("select[name=action]", label=action_label)
    page.click("button[name=index]")
    page.wait_for_selector("#staff-preview")


def _statuses(workshop) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Reminder.objects.filter(workshop=workshop).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def test_cancel_with_confirmation_then_reinstate_and_read_the_audit(
    live_server,
    plain_http_cookies,
    live_clock,
    make_workshop,
    enrol,
    new_page,
    screenshot_dir,
    django_user_model,
):
    workshop = make_workshop(starts_in=timedelta(hours=5), title="R&D <tools> night")
    enrol(workshop, 3)
    staff = django_user_model.objects.create_user(
        username="organiser", password=PASSWORD, is_staff=True
    )
    staff.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[
                "view_workshop", "change_workshop", "cancel_workshop", "view_reminder",
                "view_staffdecision",
            ]
        )
    )  # fmt: skip
    page = new_page()
    log_in(page, live_server.url, "organiser", CHANGELIST)

    # Cancel: the confirmation counts, and refuses to go on without a reason.
    _choose(page, "Cancel selected workshops")
    preview = page.locator("#staff-preview").inner_text()
    assert re.search(r"Scheduled workshops that will be cancelled\s+1", preview), preview
    assert re.search(r"Reminders that will be cancelled\s+3", preview), preview
    page.screenshot(path=screenshot_dir / "cancel-confirmation.png", full_page=True)
    page.click("#confirm-staff-action")  # no reason: the browser holds the form back
    reason = page.locator("textarea[name=reason]")
    assert reason.evaluate("field => field.validity.valueMissing") is True
    assert page.locator("#staff-preview").count() == 1  # still on the confirmation page
    assert Workshop.objects.get(pk=workshop.pk).status == "scheduled"
    page.fill("textarea[name=reason]", "The venue is flooded")
    page.click("#confirm-staff-action")
    message = page.locator("ul.messagelist li.success").inner_text()
    assert message == "Cancelled 1 workshop; 3 reminders cancelled. The decision is recorded."
    assert _statuses(workshop) == {"cancelled": 3}

    # Reinstate: the reminders come back, planned again.
    _choose(page, "Reinstate selected workshops")
    preview = page.locator("#staff-preview").inner_text()
    assert re.search(r"Cancelled reminders that will be planned again\s+3", preview), preview
    page.fill("textarea[name=reason]", "A new venue was found")
    page.screenshot(path=screenshot_dir / "reinstate-confirmation.png", full_page=True)
    page.click("#confirm-staff-action")
    assert (
        page.locator("ul.messagelist li.success")
        .inner_text()
        .startswith("Reinstated 1 workshop; 3 reminders planned again")
    )
    assert _statuses(workshop) == {"pending": 3}

    # The audit list: both decisions, who and why, times with their zone, read-only.
    page.goto(f"{live_server.url}/admin/reminders/staffdecision/")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    listing = page.locator("#result_list").inner_text()
    assert "The venue is flooded" in listing and "A new venue was found" in listing
    assert " UTC" in listing
    page.screenshot(path=screenshot_dir / "staff-decisions.png", full_page=True)
    cancel = StaffDecision.objects.get(action="cancel")
    page.goto(f"{live_server.url}/admin/reminders/staffdecision/{cancel.pk}/change/")
    assert page.locator("input[type=submit]").count() == 0  # nothing to save
    page.get_by_role("link", name="1 workshop").click()
    page.wait_for_url(re.compile(r"/admin/workshops/workshop/\?decision=\d+$"))
    assert page.locator("#result_list tbody tr").count() == 1
    assert "R&D <tools> night" in page.locator("#result_list").inner_text()
