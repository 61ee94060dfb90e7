"""Staff move a workshop whose attendees were reminded, read who will hear of it, choose not
to notify them with a reason, and see the revision on the workshop's page, in a real browser."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission

from reminders.models import Reminder, StaffDecision
from reminders.worker import pipeline
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.test_workshop_decisions_browser import _choose

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.django_db(transaction=True),
]

CHANGELIST = "/admin/workshops/workshop/"


def test_a_saved_change_says_who_hears_of_it_and_staff_can_choose_silence(
    live_server,
    plain_http_cookies,
    live_clock,
    make_workshop,
    enrol,
    new_page,
    screenshot_dir,
    django_user_model,
    settings,
    monkeypatch,
):
    settings.REMINDERS_NOTICE_SETTLE = 300
    monkeypatch.setattr("reminders.queue.publish_notices", lambda ids: True)
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Glazing", location="Room 1")
    enrol(workshop, 3)
    Reminder.objects.filter(workshop=workshop).update(
        status="sent",
        told_starts_at=workshop.starts_at,
        told_ends_at=workshop.ends_at,
        told_location="Room 1",
    )
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
    log_in(page, live_server.url, "organiser", f"{CHANGELIST}{workshop.pk}/change/")
    page.fill("input[name=location]", "Room 2")
    page.click("input[name=_continue]")
    page.wait_for_selector("ul.messagelist li.info")
    info = page.locator("ul.messagelist li.info").all_inner_texts()
    assert any(text.startswith("3 reminded attendees will get a change notice") for text in info), (
        info
    )

    page.goto(f"{live_server.url}{CHANGELIST}")
    _choose(page, "Don't notify attendees of the latest change")
    preview = page.locator("#staff-preview").inner_text()
    assert re.search(r"Reminded attendees who will not be told of the latest change\s+3", preview)
    page.fill("textarea[name=reason]", "Next door, signs are up")
    page.click("#confirm-staff-action")
    message = page.locator("ul.messagelist li.success").inner_text()
    assert message.startswith("3 reminded attendees of 1 workshop will not be told")
    assert StaffDecision.objects.get().reason == "Next door, signs are up"

    live_clock.advance(301)
    pipeline.scan(clock=live_clock)
    page.goto(f"{live_server.url}{CHANGELIST}{workshop.pk}/change/")
    table = page.locator("#notice-revisions").inner_text()
    page.screenshot(path=screenshot_dir / "notice-revisions.png", full_page=True)
    assert "Room 2" in table and "staff chose not to notify" in table and "3 silenced" in table
