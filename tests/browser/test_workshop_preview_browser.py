"""The reminder preview in a real browser: the HTML part shows inside its sandboxed frame."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

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


@pytest.mark.long
def test_staff_write_a_text_see_it_in_german_and_send_themselves_a_test(
    live_server, plain_http_cookies, make_workshop, new_page, screenshot_dir, admin_user,
    settings, smtp_sink, monkeypatch, clock,
):  # fmt: skip
    from reminders import queue
    from reminders.worker import testsend

    # A real SMTP server: the fake clock moves only when told to, or its autojump would
    # take the call's 15 s timeout while the server's reply is on its way (the engine's
    # stop poll, gone since cbb9e6e, used to hold it back 50 ms at a time).
    clock.autojump = False

    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    queued: list[int] = []
    monkeypatch.setattr(queue, "publish_test", queued.append)
    workshop = make_workshop(title="Kiln basics")
    person, _ = attendee_get_or_create(email="j@example.com", name="Jürgen")
    type(person).objects.filter(pk=person.pk).update(language="de")
    enrollment_create(attendee=person, workshop=workshop)
    admin_user.email = "ops@example.org"
    admin_user.set_password(PASSWORD)
    admin_user.save()

    page = new_page()
    change = f"/admin/workshops/workshop/{workshop.pk}/change/"
    log_in(page, live_server.url, admin_user.username, change)
    page.fill("#id_reminder_intro", "Hi {attendee_nme}, bring an apron.")
    page.get_by_role("button", name="Save and continue editing").click()
    error = page.locator(".field-reminder_intro .errorlist").inner_text()
    assert "Unknown placeholder {attendee_nme}. Did you mean {attendee_name}?" in error
    assert Workshop.objects.get(pk=workshop.pk).reminder_intro == ""

    page.fill("#id_reminder_intro", "Hi {attendee_name}, bring an apron.")
    page.locator("#texts-group .add-row a").click()
    page.select_option("#id_texts-0-language", "de")
    page.fill("#id_texts-0-reminder_intro", "Hallo {attendee_name}, bitte Schürze mitbringen.")
    page.get_by_role("button", name="Save and continue editing").click()
    assert (
        "The new text reaches 1 reminder not yet claimed"
        in page.locator(".messagelist").inner_text()
    )
    assert "Deutsch" in page.locator("#text-reach").inner_text()
    page.screenshot(path=screenshot_dir / "workshop-text.png", full_page=True)

    page.get_by_role("link", name="Preview reminder").click()
    assert page.locator("#preview-subject").inner_text().startswith("Erinnerung: Kiln basics am ")
    body = page.locator("#preview-text").inner_text()
    assert "Hallo Jürgen, bitte Schürze mitbringen." in body and "Wann:" in body
    assert "In Deutsch" in page.locator("#preview-language").inner_text()
    page.get_by_role("button", name="Send me a test").click()
    assert "is on its way to ops@example.org" in page.locator(".messagelist").inner_text()
    page.screenshot(path=screenshot_dir / "workshop-preview-de.png", full_page=True)

    # What the worker's task does, in a thread of its own: Playwright's event
    # loop runs in this one, and the bridge refuses to block a running loop.
    (decision_id,) = queued
    done: list = []

    def run() -> None:
        try:
            done.append(testsend.reminder_send_test_run(decision_id=decision_id))
        finally:
            connections.close_all()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(30)
    assert done and done[0].changed == 1, done
    (message,) = smtp_sink.received()
    assert message.rcpt_tos == ("ops@example.org",)
    assert message.subject.startswith("[Test] Erinnerung: Kiln basics am ")
    assert "bitte Schürze mitbringen" in message.parsed().get_body(("plain",)).get_content()
