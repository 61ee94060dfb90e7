"""An attendee opens the "can't attend" link of the reminder they received, confirms in a
real browser, and their place is cancelled: no reminder follows, only the calendar's
cancellation (issue 36; the cancellation notice is issue 35's)."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.db import connections

from reminders.links import attendance_token, unsubscribe_token
from reminders.models import Reminder
from reminders.worker import pipeline
from reminders.worker.notices import deliver_notices
from tests.browser.conftest import PHONE
from workshops.models import Enrollment

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _in_thread(job) -> None:
    """Run ``job`` in a thread of its own: Playwright's event loop runs in this one, and a
    delivery session refuses to block a running loop."""
    errors: list[BaseException] = []

    def run():
        try:
            job()
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not errors, errors


def test_the_link_from_a_delivered_reminder_cancels_after_one_click(
    live_server,
    plain_http_cookies,
    live_clock,
    make_workshop,
    enrol,
    new_page,
    screenshot_dir,
    smtp_sink,
    settings,
    published,
    notices_published,
):
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_PUBLIC_URL = live_server.url
    settings.REMINDERS_NOTICE_SETTLE = 0
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Wheel throwing")
    leaving, staying = enrol(workshop, count=2)
    pipeline.scan(clock=live_clock)
    _in_thread(lambda: [pipeline.deliver(b, clock=live_clock) for b in list(published)])
    [message] = [m for m in smtp_sink.received() if m.rcpt_tos == (leaving.attendee.email,)]
    body = message.parsed().get_body(("plain",)).get_content()
    [link] = re.findall(rf"{re.escape(live_server.url)}/attend/\S+", body)

    page = new_page()
    page.goto(link)
    assert page.locator("h1").inner_text() == "Wheel throwing"
    assert Enrollment.objects.get(pk=leaving.pk).status == "active"  # opening changes nothing
    page.screenshot(path=screenshot_dir / "cant-attend.png", full_page=True)
    page.click("#confirm")
    page.wait_for_selector("#done")
    assert "Your place is cancelled" in page.locator("#done").inner_text()
    assert Enrollment.objects.get(pk=leaving.pk).status == "cancelled"
    assert Enrollment.objects.get(pk=staying.pk).status == "active"

    received = len(smtp_sink.received())
    published.clear()
    for _ in range(2):
        pipeline.scan(clock=live_clock)
    assert published == []  # no reminder to send
    _in_thread(lambda: [deliver_notices(b, clock=live_clock) for b in list(notices_published)])
    after = smtp_sink.received()[received:]
    assert [m.rcpt_tos for m in after] == [(leaving.attendee.email,)]
    assert after[0].subject.startswith("Cancelled: Wheel throwing")
    assert Reminder.objects.get(enrollment=leaving).status == "sent"


@pytest.mark.parametrize(
    ("path", "token"), [("attend", attendance_token), ("unsubscribe", unsubscribe_token)]
)
def test_each_page_fits_a_phone_and_its_button_a_fingertip_without_javascript(
    live_server, plain_http_cookies, live_clock, make_workshop, enrol, chromium, path, token
):
    """At 375 px, scripts off: no sideways scroll, text at 16 px, a 44 x 44 px button."""
    [enrollment] = enrol(make_workshop(starts_in=timedelta(hours=5), title="Wheel throwing"))
    reminder = Reminder.objects.get(enrollment=enrollment)
    context = chromium.new_context(**PHONE, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"{live_server.url}/{path}/{token(reminder.pk)}/")
        fits = "() => document.documentElement.scrollWidth <= window.innerWidth"
        size = "() => parseFloat(getComputedStyle(document.body).fontSize)"
        assert page.evaluate(fits) and page.evaluate(size) >= 16
        box = page.locator("#confirm").bounding_box()
        assert box["width"] >= 44 and box["height"] >= 44, box
        page.locator("#confirm").tap()
        page.wait_for_selector("#done")
        assert page.evaluate(fits)
    finally:
        context.close()


def test_no_request_the_page_makes_carries_the_token_in_its_referer(
    live_server, plain_http_cookies, live_clock, make_workshop, enrol, chromium
):
    """With same-origin, the confirming POST and the browser's own /favicon.ico carried the
    whole link in Referer: a proxy in front of web logging the referrer (nginx's "combined")
    kept every attendee's token."""
    [enrollment] = enrol(make_workshop(starts_in=timedelta(hours=5), title="Wheel throwing"))
    reminder = Reminder.objects.get(enrollment=enrollment)
    tokens = [attendance_token(reminder.pk), unsubscribe_token(reminder.pk)]
    context = chromium.new_context()
    referers: list[str] = []
    context.on("request", lambda request: referers.append(request.headers.get("referer", "")))
    try:
        page = context.new_page()
        for path, token in zip(("attend", "unsubscribe"), tokens, strict=True):
            page.goto(f"{live_server.url}/{path}/{token}/")
            page.click("#confirm")
            page.wait_for_selector("#done")
    finally:
        context.close()
    assert len(referers) >= 4  # two pages, two confirmations
    assert [referer for referer in referers if any(token in referer for token in tokens)] == []
    assert Enrollment.objects.get(pk=enrollment.pk).status == "cancelled"
