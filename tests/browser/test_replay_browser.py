"""Staff replay failed reminders in a real browser; a real worker delivers them by SMTP.

Live server (a thread of this process), a Celery worker process on Redis
reading the same test database, and the loopback SMTP sink: nothing mocked.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django_celery_beat.models import PeriodicTask

from clock import SystemClock
from delivery.results import DeliveryResult, Outcome
from reminders.models import Reminder
from reminders.schedule import ensure_scan_schedule
from reminders.services import reminder_claim_batch, reminder_record_batch
from tests.browser.conftest import PASSWORD, log_in
from tests.support.processes import celery_worker, process_env

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.django_db(transaction=True),
]

_real = SystemClock()


def _staff(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(
        username=username, password=PASSWORD, is_staff=True
    )
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="reminders", codename__in=codenames)
    )
    return user


def _fail(ids: list[int], clock) -> None:
    """Claim and record a permanent failure, as a worker does for a refused address."""
    claim = reminder_claim_batch(ids=ids, channel="smtp", worker="earlier-run", clock=clock)
    reminder_record_batch(
        claim=claim,
        results=[
            DeliveryResult(
                reminder_id=r.pk, key=r.key, outcome=Outcome.PERMANENT, message_id=None,
                error="550 5.1.1 mailbox temporarily disabled", attempts=1,
                provider_reached=True, maybe_delivered=False,
            )
            for r in claim.reminders
        ],
        clock=clock,
    )  # fmt: skip


def _wait_until(predicate, *, timeout: float = 60, what: str) -> None:
    deadline = _real.monotonic() + timeout
    while _real.monotonic() < deadline:
        if predicate():
            return
        _real.sleep_blocking(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_staff_replay_failed_reminders_and_the_worker_delivers_them(
    live_server,
    plain_http_cookies,
    live_clock,
    broker,
    smtp_sink,
    make_workshop,
    enrol,
    new_page,
    screenshot_dir,
    django_user_model,
    settings,
):
    workshop = make_workshop(starts_in=timedelta(hours=3), title="Async Python deep dive")
    enrol(workshop, 3)
    failed = list(Reminder.objects.filter(workshop=workshop).values_list("pk", flat=True))
    _fail(failed, live_clock)
    assert set(Reminder.objects.values_list("status", flat=True)) == {"failed"}
    scan = ensure_scan_schedule()
    PeriodicTask.objects.filter(pk=scan.pk).update(
        last_run_at=live_clock.now() - timedelta(minutes=10)
    )
    _staff(django_user_model, "replayer", "view_reminder", "replay_reminder", "view_staffdecision")
    _staff(django_user_model, "viewer", "view_reminder")
    changelist = "/admin/reminders/reminder/"

    env = process_env(
        REMINDERS_CHANNEL="smtp", EMAIL_HOST="127.0.0.1", EMAIL_PORT=str(smtp_sink.port)
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    with celery_worker(env, concurrency=1, name="browser"):
        page = new_page()
        log_in(page, live_server.url, "replayer", changelist)
        page.locator("#changelist-filter").get_by_role("link", name="Failed", exact=True).click()
        page.wait_for_url(re.compile(r"status__exact=failed"))
        assert page.locator("#result_list tbody tr").count() == 3
        page.check("#action-toggle")
        page.select_option("select[name=action]", label="Replay selected reminders")
        page.click("button[name=index]")

        page.wait_for_selector("#staff-preview")
        preview = page.locator("#staff-preview").inner_text()
        assert re.search(r"Will be queued for delivery again\s+3", preview), preview
        assert page.locator("#confirm-staff-action").get_attribute("value") == (
            "Yes, replay 3 reminders"
        )
        page.screenshot(path=screenshot_dir / "replay-confirmation.png", full_page=True)
        page.click("#confirm-staff-action")

        message = page.locator("ul.messagelist li.success").inner_text()
        assert message == "Replayed 3 reminders: 3 queued for delivery."
        _wait_until(
            lambda: Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 3},
            what="the worker to send the replayed reminders",
        )
        page.goto(f"{live_server.url}{changelist}?status__exact=sent")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 3
        assert {rows.nth(i).locator("td.field-status_value").inner_text() for i in range(3)} == {
            "sent"
        }

        # A selection above REMINDERS_REPLAY_INLINE_LIMIT goes to the worker; the message
        # links to its staff decision, which shows the progress until it is done.
        settings.REMINDERS_REPLAY_INLINE_LIMIT = 5
        large = make_workshop(starts_in=timedelta(hours=3), title="Large replay")
        enrol(large, 12)
        large_ids = list(Reminder.objects.filter(workshop=large).values_list("pk", flat=True))
        _fail(large_ids, live_clock)
        page.goto(f"{live_server.url}{changelist}?workshop__id__exact={large.pk}")
        assert page.locator("#result_list tbody tr").count() == 12
        page.check("#action-toggle")
        page.select_option("select[name=action]", label="Replay selected reminders")
        page.click("button[name=index]")
        page.wait_for_selector("#staff-preview")
        page.click("#confirm-staff-action")
        message = page.locator("ul.messagelist li.success").inner_text()
        assert message.startswith("Replaying 12 selected reminders in the background"), message
        page.locator("ul.messagelist li.success a").click()
        page.wait_for_url(re.compile(r"/admin/reminders/staffdecision/\d+/change/"))
        _wait_until(
            lambda: (
                Counter(Reminder.objects.filter(workshop=large).values_list("status", flat=True))
                == {"sent": 12}
            ),
            what="the worker to replay and send the large selection",
        )
        page.reload()
        details = page.locator("#content-main").inner_text()
        assert "Done" in details and "12 reminders" in details, details
        page.screenshot(path=screenshot_dir / "background-replay.png", full_page=True)

        page.goto(f"{live_server.url}{changelist}health/")
        assert "celery beat is down" in page.locator("#scheduler-warning").inner_text()
        page.screenshot(path=screenshot_dir / "scheduler-health.png", full_page=True)

        other = new_page()
        log_in(other, live_server.url, "viewer", changelist)
        assert other.locator("#result_list tbody tr").count() == 15
        options = other.locator("select[name=action] option").all_inner_texts()
        assert "Replay selected reminders" not in options

    received = Counter(r.lower() for m in smtp_sink.received() for r in m.rcpt_tos)
    expected = {
        email.lower() for email in Reminder.objects.values_list("attendee__email", flat=True)
    }
    assert set(received) == expected and set(received.values()) == {1}
