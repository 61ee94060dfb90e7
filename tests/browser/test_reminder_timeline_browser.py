"""A reminder's page shows its timeline in a real browser (issue 13, item 2): the same lines
as ``manage.py reminder_trace``, for a reminder retried, reaped, refused (so left unknown: the
reaped attempt may have reached the provider) and sent again by staff."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission

from delivery.results import DeliveryResult, Outcome
from reminders.models import Reminder, StaffDecision
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_reap
from reminders.services.replay import reminder_resolve_unknown
from reminders.trace import reminder_lookup, trace_lines
from tests.browser.conftest import PASSWORD, log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.django_db(transaction=True),
]


def test_the_reminder_page_shows_its_timeline(
    live_server,
    plain_http_cookies,
    live_clock,
    due_reminders,
    new_page,
    screenshot_dir,
    django_user_model,
    settings,
    published,
):
    (pk,) = due_reminders(1)
    clock = live_clock

    def answered(claim, outcome: Outcome, error: str) -> None:
        reminder_record_batch(
            claim=claim,
            results=[
                DeliveryResult(
                    reminder_id=pk, key=claim.reminders[0].key, outcome=outcome,
                    message_id=None, error=error, attempts=1,
                    provider_reached=True, maybe_delivered=False,
                )
            ],
            clock=clock,
        )  # fmt: skip

    first = reminder_claim_batch(ids=[pk], channel="http", worker="worker1@host", clock=clock)
    answered(first, Outcome.TRANSIENT, "503 Service Unavailable")
    clock.advance(timedelta(minutes=10).total_seconds())
    reminder_claim_batch(ids=[pk], channel="http", worker="worker2@host", clock=clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)
    assert reminders_reap(clock=clock)["requeued"] == 1  # under its key
    clock.advance(timedelta(minutes=10).total_seconds())
    third = reminder_claim_batch(ids=[pk], channel="http", worker="worker1@host", clock=clock)
    answered(third, Outcome.PERMANENT, "HTTP 422 Unprocessable Content")
    assert Reminder.objects.get(pk=pk).status == Reminder.Status.UNKNOWN
    staff = django_user_model.objects.create_user(username="ops", password=PASSWORD, is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_reminder", "resolve_unknown_reminder"])
    )
    clock.advance(60)
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=pk),
        decision=StaffDecision.Action.SEND_AGAIN,
        actor=staff,
        clock=clock,
        reason="provider back",
    )

    page = new_page()
    log_in(page, live_server.url, "ops", f"/admin/reminders/reminder/{pk}/change/")
    items = page.locator("ol.reminder-timeline li")
    shown = [items.nth(i).inner_text() for i in range(items.count())]
    assert shown == trace_lines(reminder_lookup(str(pk)))
    # planned, three claims, two outcomes and the reaper's, the decision to send it again
    # and the dispatch it made, now.
    assert len(shown) == 10, shown
    assert "dispatched: queued in a batch of 1" in shown[-2]
    page.locator("ol.reminder-timeline").scroll_into_view_if_needed()
    page.screenshot(path=screenshot_dir / "reminder-timeline.png", full_page=True)
