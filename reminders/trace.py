"""One reminder's history, read back from its durable records (``manage.py reminder_trace``)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import Q

from reminders.models import (
    DeliveryAttempt,
    DeliveryEvent,
    Dispatch,
    Notice,
    Reminder,
    StaffDecision,
    id_from_text,
)


def reminder_lookup(identifier: str) -> Reminder:
    """Return the reminder whose id or key is ``identifier``; raise ``Reminder.DoesNotExist``."""
    identifier = identifier.strip()
    query = Q(key=identifier)
    if (pk := id_from_text(identifier)) is not None:
        query |= Q(pk=pk)
    return Reminder.objects.select_related("workshop", "attendee").get(query)


def trace_lines(reminder: Reminder) -> list[str]:
    """Return one line per event, oldest first: the time in UTC and in the workshop's zone, then
    what (ties: planned, attempts, decisions, dispatches)."""
    workshop = reminder.workshop
    events = [
        (
            reminder.created_at,
            f"planned: reminder {reminder.pk} {reminder.key}, workshop {workshop.pk} "
            f"{workshop.title!r} ({workshop.timezone}), attendee {reminder.attendee_id}; "
            f"window opens {_utc(reminder.window_opens_at)}, deadline {_utc(reminder.deadline_at)}",
        )
    ]
    for attempt in DeliveryAttempt.objects.filter(reminder=reminder).order_by("number", "pk"):
        events.append(
            (
                attempt.claimed_at,
                f"claimed: attempt {attempt.number} by {attempt.worker or 'unnamed worker'} "
                f"on {attempt.channel}, token {attempt.claim_token}, "
                f"lease until {_utc(attempt.lease_expires_at)}",
            )
        )
        if attempt.finished_at is None:
            continue
        detail = f"outcome of attempt {attempt.number}: {attempt.outcome}"
        if attempt.outcome == DeliveryAttempt.Outcome.LEASE_EXPIRED:
            detail = f"reaper: attempt {attempt.number}'s lease expired, {attempt.outcome}"
        if attempt.provider_calls:
            detail += f", {attempt.provider_calls} provider call(s)"
        if attempt.provider_message_id:
            detail += f", message {attempt.provider_message_id}"
        if attempt.error:
            detail += f", error: {attempt.error}"
        events.append((attempt.finished_at, detail))
    for report in DeliveryEvent.objects.filter(reminder=reminder).order_by("occurred_at", "pk"):
        detail = f"provider reports on {report.channel}: {report.kind}"
        if report.bounce:
            detail += f" ({report.bounce})"
        if report.reason:
            detail += f", {report.reason}"
        detail += f" (event {report.event_id}, received {_utc(report.received_at)})"
        events.append((report.occurred_at, detail))
    for notice in Notice.objects.filter(reminder=reminder).order_by("number", "pk"):
        events.extend(_notice_events(notice))
    if reminder.unsubscribed_at is not None:
        events.append(
            (
                reminder.unsubscribed_at,
                "the attendee unsubscribed from this workshop's messages (one-click "
                "unsubscribe): no change notice follows",
            )
        )
    named = (
        ("reminder_ids", reminder.pk),
        ("workshop_ids", reminder.workshop_id),
        ("attendee_ids", reminder.attendee_id),
        ("enrollment_ids", reminder.enrollment_id),
    )
    # A test send names the workshop but touched none of its reminders.
    decisions = StaffDecision.objects.exclude(action=StaffDecision.Action.SEND_TEST)
    for decision in _naming(decisions.order_by("created_at", "pk"), named):
        detail = f"staff {decision.action} by {decision.actor_name or 'unknown'} ({decision.state})"
        if decision.reason:
            detail += f": {decision.reason}"
        events.append((decision.created_at, detail))
    dispatches = Dispatch.objects.order_by("queued_at", "pk")
    for dispatch in _naming(dispatches, (("reminder_ids", reminder.pk),)):
        events.append(
            (
                dispatch.queued_at,
                f"dispatched: queued in a batch of {len(dispatch.reminder_ids)} "
                f"(dispatch {dispatch.pk}), its message expires {_utc(dispatch.expires_at)}",
            )
        )
        if dispatch.publish_failed_at is not None:
            events.append(
                (
                    dispatch.publish_failed_at,
                    f"publish failed: the broker did not take the message of dispatch "
                    f"{dispatch.pk}; its rows are due again at the next scan",
                )
            )
    events.sort(key=lambda event: event[0])
    events.append((reminder.updated_at, f"now: {_state(reminder)}"))
    zone = ZoneInfo(workshop.timezone)
    return [
        f"{_utc(at)}  {at.astimezone(zone):%Y-%m-%d %H:%M:%S %Z}  {what}" for at, what in events
    ]


def _notice_events(notice: Notice) -> list[tuple[datetime, str]]:
    """A change notice's life: planned, then how it ended (or where it stands)."""
    label = f"notice {notice.number} ({notice.get_kind_display().lower()}, {notice.key})"
    events = [
        (
            notice.created_at,
            f"{label} planned: the workshop's revision {notice.number} differs from what the "
            "attendee was told",
        )
    ]
    if notice.status == Notice.Status.SENT:
        detail = f"{label} sent on {notice.channel}"
        if notice.provider_message_id:
            detail += f", message {notice.provider_message_id}"
        events.append((notice.sent_at or notice.updated_at, detail))
    elif notice.status != Notice.Status.PENDING or notice.attempts:
        detail = f"{label} {notice.status}"
        if notice.status_reason:
            detail += f" ({notice.status_reason})"
        detail += f", {notice.attempts} attempt(s)"
        if notice.last_error:
            detail += f", last error: {notice.last_error}"
        events.append((notice.updated_at, detail))
    return events


def _naming(rows, fields: tuple[tuple[str, int], ...]) -> list:
    """Return the ``rows`` whose JSON id list ``field`` holds ``id``, for any (field, id)."""
    if connection.features.supports_json_field_contains:
        # field @> '[id]', answered by a GIN index for Dispatch (migration 0009).
        query = Q()
        for field, value in fields:
            query |= Q(**{f"{field}__contains": [value]})
        return list(rows.filter(query))
    # SQLite (the local run) cannot search inside JSON lists; its rows are few.
    return [
        row for row in rows if any(value in (getattr(row, field) or []) for field, value in fields)
    ]


def _state(reminder: Reminder) -> str:
    text = str(reminder.status)
    if reminder.status_reason:
        text += f" ({reminder.status_reason})"
    if reminder.status == Reminder.Status.QUEUED and reminder.queued_until:
        text += f", its message expires {_utc(reminder.queued_until)}"
    if reminder.next_attempt_at:
        text += f", next attempt not before {_utc(reminder.next_attempt_at)}"
    if reminder.last_error and reminder.status != Reminder.Status.SENT:
        text += f", last error: {reminder.last_error}"
    if reminder.sent_at:
        text += f", sent {_utc(reminder.sent_at)}"
    return text + f", {reminder.attempts} attempt(s) counted"


def _utc(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
