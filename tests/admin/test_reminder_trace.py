"""manage.py reminder_trace: one reminder's timeline, from the records the database keeps."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from delivery.results import DeliveryResult, Outcome
from reminders.models import Reminder, StaffDecision
from reminders.services import (
    reminder_claim_batch,
    reminder_record_batch,
    reminders_dispatch,
    reminders_reap,
)
from reminders.services.replay import reminder_resolve_unknown

pytestmark = pytest.mark.django_db


def _trace(identifier: str) -> list[str]:
    out = StringIO()
    call_command("reminder_trace", identifier, stdout=out)
    return out.getvalue().splitlines()


def _transient(reminder, *, outcome=Outcome.TRANSIENT, error="503 busy") -> DeliveryResult:
    return DeliveryResult(
        reminder_id=reminder.pk,
        key=reminder.key,
        outcome=outcome,
        message_id=None,
        error=error,
        attempts=1,
        provider_reached=True,
        maybe_delivered=False,
    )


def test_the_trace_of_a_reminder_retried_reaped_refused_and_sent_again(
    clock, due_reminders, resolver, published, settings
):
    (pk,) = due_reminders(1)
    assert reminders_dispatch(publish=lambda ids: None, clock=clock) == 1
    clock.advance(1)
    first = reminder_claim_batch(ids=[pk], channel="http", worker="w1@host", clock=clock)
    reminder_record_batch(claim=first, results=[_transient(first.reminders[0])], clock=clock)
    clock.advance(timedelta(minutes=10).total_seconds())
    second = reminder_claim_batch(ids=[pk], channel="http", worker="w2@host", clock=clock)
    assert second.reminders, "the retry was not claimable"
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)  # w2 vanished with its claim
    assert reminders_reap(clock=clock)["requeued"] == 1  # under its key
    clock.advance(timedelta(minutes=10).total_seconds())
    third = reminder_claim_batch(ids=[pk], channel="http", worker="w1@host", clock=clock)
    refused = _transient(third.reminders[0], outcome=Outcome.PERMANENT, error="HTTP 422")
    reminder_record_batch(claim=third, results=[refused], clock=clock)
    # The reaped attempt may have reached the provider, so the refusal leaves it unknown.
    assert Reminder.objects.get(pk=pk).status == Reminder.Status.UNKNOWN
    clock.advance(60)
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=pk),
        decision=StaffDecision.Action.SEND_AGAIN,
        actor=resolver,
        clock=clock,
        reason="retry it",
    )
    reminder = Reminder.objects.get(pk=pk)

    lines = _trace(str(pk))
    assert lines == _trace(reminder.key)
    events = [line.split("  ", 2)[2] for line in lines]
    expected = [
        "planned: ",
        "dispatched: queued in a batch of 1 ",
        "claimed: attempt 1 by w1@host on http, token " + str(first.token),
        "outcome of attempt 1: transient, 1 provider call(s), error: 503 busy",
        "claimed: attempt 2 by w2@host on http, token " + str(second.token),
        "reaper: attempt 2's lease expired, lease_expired",
        "claimed: attempt 3 by w1@host on http, token " + str(third.token),
        "outcome of attempt 3: permanent, 1 provider call(s), error: HTTP 422",
        "staff send_again by resolver (done): retry it",
        "dispatched: queued in a batch of 1 ",
        "now: queued",
    ]
    assert len(events) == len(expected), "\n".join(lines)
    for event, start in zip(events, expected, strict=True):
        assert event.startswith(start), f"{event!r} should start with {start!r}"
    # Each line is stamped in UTC and in the workshop's zone, in time order.
    zone = reminder.workshop.timezone
    assert zone == "Europe/Berlin"
    assert all(" UTC  " in line and (" CET  " in line or " CEST  " in line) for line in lines)
    stamps = [line.split(" UTC", 1)[0] for line in lines]
    assert stamps == sorted(stamps)


def test_an_unknown_reminder_is_a_clear_error(db):
    with pytest.raises(CommandError, match="No reminder has the id or key 'rem-w9-a9'"):
        _trace("rem-w9-a9")


def test_the_reminder_page_shows_the_same_timeline(admin_client, clock, due_reminders):
    from django.urls import reverse
    from django.utils.html import escape

    from reminders.trace import reminder_lookup, trace_lines

    (pk,) = due_reminders(1)
    claim = reminder_claim_batch(ids=[pk], channel="http", worker="w1@host", clock=clock)
    reminder_record_batch(claim=claim, results=[_transient(claim.reminders[0])], clock=clock)
    page = admin_client.get(reverse("admin:reminders_reminder_change", args=[pk]))
    assert page.status_code == 200
    html = page.content.decode()
    lines = trace_lines(reminder_lookup(str(pk)))
    assert len(lines) == 4  # planned, claimed, outcome, now
    for line in lines:
        assert escape(line) in html


def test_the_attendees_unsubscribe_is_a_line_of_the_trace_in_its_place(
    clock, due_reminders, settings
):
    """Why no change notice follows is in the timeline, as the attendee's own cancel is."""
    from reminders.services.attendance import reminder_unsubscribe

    (pk,) = due_reminders(1)
    claim = reminder_claim_batch(ids=[pk], channel="http", worker="w1@host", clock=clock)
    sent = _transient(claim.reminders[0], outcome=Outcome.SENT, error="")
    reminder_record_batch(claim=claim, results=[sent], clock=clock)
    clock.advance(600)
    assert reminder_unsubscribe(reminder=Reminder.objects.get(pk=pk), clock=clock)

    lines = _trace(str(pk))
    [line] = [line for line in lines if "unsubscribed" in line]
    assert line.startswith(f"{clock.now():%Y-%m-%d %H:%M:%S} UTC  ")
    assert line.split("  ", 2)[2] == (
        "the attendee unsubscribed from this workshop's messages (one-click unsubscribe): "
        "no change notice follows"
    )
    assert lines.index(line) == len(lines) - 2  # after the send, before the state now


def test_a_dispatch_whose_publish_failed_says_so_and_that_its_rows_are_due_again(
    clock, due_reminders, django_capture_on_commit_callbacks
):
    """B1 in the timeline: the broker refused the message, so nothing waits for it."""
    (pk,) = due_reminders(1)
    with django_capture_on_commit_callbacks(execute=True):
        assert reminders_dispatch(publish=lambda ids: False, clock=clock) == 1
    reminder = Reminder.objects.get(pk=pk)
    assert reminder.queued_until == clock.now()  # due again at the next scan

    events = [line.split("  ", 2)[2] for line in _trace(str(pk))]
    assert events[1].startswith("dispatched: queued in a batch of 1 ")
    assert events[2].startswith("publish failed: the broker did not take the message of dispatch ")
    assert events[2].endswith("; its rows are due again at the next scan")
    assert events[3].startswith("now: queued, its message expires ")
    assert len(events) == 4
