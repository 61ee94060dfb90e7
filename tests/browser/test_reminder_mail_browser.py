"""A reminder's HTML body, rendered by a real Chromium as a mail reader would show it.

Inline styles only (mail readers drop <style> sheets and never load links or
scripts); the place, the join link and the organiser show; a right-to-left
name and markup in the title stay text. The screenshot is checked by eye.
"""

from __future__ import annotations

import re

import pytest

from reminders.content import notice_preview, reminder_envelope
from reminders.models import Reminder
from tests.browser.axe import assert_no_violations, axe_violations
from tests.browser.conftest import PHONE
from workshops.models import Workshop
from workshops.services import attendee_get_or_create, enrollment_create

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.long, pytest.mark.django_db]


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


def test_a_reminder_and_a_change_notice_fit_a_phones_width(
    clock, make_workshop, enrol, chromium, settings
):
    """Laid out at the phone's 375 px, as readable as the pages, with no sideways scroll:
    the "can't attend" link and a meeting's join link are longer than the screen is wide."""
    settings.REMINDERS_PUBLIC_URL = "https://reminders.example.com"
    join = "https://meet.example.org/j/83517294601?pwd=Zk3uQ9bXv2LmT7sWc4YhR8nE1dA6fG0j.1"
    workshop = make_workshop(join_url=join)
    [enrollment] = enrol(workshop)
    reminder = Reminder.objects.select_related("workshop", "attendee").get()
    Reminder.objects.filter(pk=reminder.pk).update(
        told_starts_at=workshop.starts_at, told_ends_at=workshop.ends_at, told_join_url=join + "0"
    )
    notice = notice_preview(workshop=workshop, attendee=enrollment.attendee, now=clock.now())
    context = chromium.new_context(**PHONE)
    try:
        page = context.new_page()
        for html in (reminder_envelope(reminder=reminder).html_body, notice.envelope.html_body):
            page.set_content(html)
            widths = page.evaluate(
                "() => [window.innerWidth, document.documentElement.scrollWidth]"
            )
            assert widths == [375, 375], html
    finally:
        context.close()


def test_every_message_an_attendee_may_get_has_no_accessibility_violation(
    clock, make_workshop, make_attendee, new_page, settings
):
    """axe-core (tests/browser/axe.py: WCAG 2.1 A/AA) on the HTML part of a reminder, a change
    notice and a cancellation, in each language, with every line and link they can carry.
    Without a title, a screen reader opening one names it by its file, not its subject."""
    settings.REMINDERS_PUBLIC_URL = "https://reminders.example.com"
    details = {"location": "Room 4", "join_url": "https://meet.example.org/k?id=7",
               "contact_name": "Ada Lovelace", "contact_email": "ada@example.org"}  # fmt: skip
    page, found = new_page(), {}
    for language in ("en", "de", "fr"):
        workshop = make_workshop(title=f"Kiln basics ({language})")
        Workshop.objects.filter(pk=workshop.pk).update(**details)
        attendee = make_attendee(language=language, zone="America/New_York")
        enrollment_create(attendee=attendee, workshop=workshop)
        reminder = Reminder.objects.select_related("workshop", "attendee").get(attendee=attendee)
        Reminder.objects.filter(pk=reminder.pk).update(
            told_starts_at=workshop.starts_at, told_ends_at=workshop.ends_at, told_location="Hall"
        )
        messages = {"reminder": reminder_envelope(reminder=reminder)}
        messages["change notice"] = notice_preview(
            workshop=workshop, attendee=attendee, now=clock.now()
        ).envelope
        Workshop.objects.filter(pk=workshop.pk).update(status=Workshop.Status.CANCELLED)
        workshop.refresh_from_db()
        messages["cancellation"] = notice_preview(
            workshop=workshop, attendee=attendee, now=clock.now()
        ).envelope
        for name, envelope in messages.items():
            page.set_content(envelope.html_body)
            assert page.title() == envelope.subject
            found[f"{name}, {language}"] = axe_violations(page, page_rules=False)
    assert_no_violations(found)
