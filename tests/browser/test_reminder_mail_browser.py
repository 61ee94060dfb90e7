"""A reminder's HTML body, rendered by a real Chromium as a mail reader would show it.

Inline styles only (mail readers drop <style> sheets and never load links or
scripts); the place, the join link and the organiser show; a right-to-left
name and markup in the title stay text. The screenshot is checked by eye.
"""

from __future__ import annotations

import re

import pytest

from reminders.content import reminder_envelope
from reminders.models import Reminder
from workshops.models import Workshop
from workshops.services import attendee_get_or_create, enrollment_create

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db]


def test_the_html_body_renders_with_inline_styles_only(make_workshop, new_page, screenshot_dir):
    workshop = make_workshop(title="Kiln basics <b>& glazes</b>")
    Workshop.objects.filter(pk=workshop.pk).update(
        location="Room 4, Kiln House",
        join_url="https://meet.example.org/kiln?id=7&lang=en",
        contact_name="Ada Lovelace",
        contact_email="ada@example.org",
    )
    attendee, _ = attendee_get_or_create(email="layla@example.com", name="ليلى")
    enrollment_create(attendee=attendee, workshop=workshop)
    reminder = Reminder.objects.select_related("workshop", "attendee").get()
    html = reminder_envelope(reminder=reminder).html_body

    assert not re.search(r"<(style|link|script)\b", html, re.IGNORECASE)
    assert not re.search(r"\bclass=", html)
    page = new_page()
    page.set_content(html)
    body = page.locator("body").inner_text()
    assert "Hello ليلى," in body
    assert "Kiln basics <b>& glazes</b>" in body  # escaped: shown, not markup
    assert page.locator("b").count() == 0
    assert "Where: Room 4, Kiln House" in body
    link = page.locator("a")
    assert link.get_attribute("href") == "https://meet.example.org/kiln?id=7&lang=en"
    assert "Organiser: Ada Lovelace <ada@example.org>" in body
    page.screenshot(path=screenshot_dir / "reminder-mail.png", full_page=True)
