"""The reminder preview in a real browser: the HTML part shows inside its sandboxed frame."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD, log_in
from workshops.models import Workshop
from workshops.services import attendee_get_or_create, enrollment_create

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_staff_preview_a_reminder_as_an_attendee_gets_it(
    live_server, plain_http_cookies, make_workshop, new_page, screenshot_dir, admin_user
):
    workshop = make_workshop(title="Kiln basics")
    Workshop.objects.filter(pk=workshop.pk).update(
        location="Room 4, Kiln House",
        join_url="https://meet.example.org/kiln",
        contact_name="Ada Lovelace",
        contact_email="ada@example.org",
    )
    for email, name in (("a@example.com", "Anna"), ("t@example.com", "Taro")):
        person, _ = attendee_get_or_create(email=email, name=name)
        enrollment_create(attendee=person, workshop=workshop)
    admin_user.set_password(PASSWORD)
    admin_user.save()

    page = new_page()
    log_in(
        page,
        live_server.url,
        admin_user.username,
        f"/admin/workshops/workshop/{workshop.pk}/change/",
    )
    page.get_by_role("link", name="Preview reminder").click()
    page.select_option("#preview-attendee", label="Taro <t@example.com>")
    page.get_by_role("button", name="Show").click()
    assert page.locator("#preview-subject").inner_text().startswith("Reminder: Kiln basics starts")
    assert "Hello Taro," in page.locator("#preview-text").inner_text()
    frame = page.frame_locator("#preview-html")
    assert "Where: Room 4, Kiln House" in frame.locator("body").inner_text()
    assert frame.locator("a").get_attribute("href") == "https://meet.example.org/kiln"
    assert "LOCATION:Room 4\\, Kiln House" in page.locator("#preview-ics").inner_text()
    assert "force_escape" not in page.locator("#content-main").inner_text()  # no stray comment
    page.screenshot(path=screenshot_dir / "workshop-preview.png", full_page=True)
