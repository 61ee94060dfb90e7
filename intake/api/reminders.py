"""Reminders with their change notices and delivery attempts, read only."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.db.models import Prefetch, QuerySet
from ninja import Path, Query, Router, Schema

from intake.api.common import (
    Id,
    Paging,
    Scope,
    errors,
    get_or_404,
    page_of,
    require,
)
from reminders.models import DeliveryAttempt, Notice, Reminder

reminders = Router(tags=["reminders"])
ReminderStatus = Literal[tuple(Reminder.Status.values)]  # type: ignore[valid-type]


class NoticeOut(Schema):
    number: int
    kind: str
    status: str
    status_reason: str
    attempts: int
    sent_at: datetime | None
    created_at: datetime


class AttemptOut(Schema):
    number: int
    channel: str
    claimed_at: datetime
    finished_at: datetime | None
    outcome: str
    error: str


class ReminderOut(Schema):
    id: int
    workshop: int
    attendee: int
    enrolment: int
    status: str
    status_reason: str
    attempts: int
    channel: str
    sent_at: datetime | None
    next_attempt_at: datetime | None
    updated_at: datetime
    notices: list[NoticeOut]


class ReminderDetail(ReminderOut):
    history: list[AttemptOut]


class ReminderPage(Schema):
    page: int
    page_size: int
    has_next: bool
    items: list[ReminderOut]


def _notice_out(n: Notice) -> dict:
    return {
        f: getattr(n, f)
        for f in ("number", "kind", "status", "status_reason", "attempts", "sent_at", "created_at")
    }


def _reminder_out(r: Reminder) -> dict:
    return {
        "id": r.pk,
        "workshop": r.workshop_id,
        "attendee": r.attendee_id,
        "enrolment": r.enrollment_id,
        "status": r.status,
        "status_reason": r.status_reason,
        "attempts": r.attempts,
        "channel": r.channel,
        "sent_at": r.sent_at,
        "next_attempt_at": r.next_attempt_at,
        "updated_at": r.updated_at,
        "notices": [_notice_out(n) for n in r.notices.all()],
    }


def _with_notices(rows: QuerySet) -> QuerySet:
    return rows.prefetch_related(Prefetch("notices", queryset=Notice.objects.order_by("number")))


@reminders.get("", response={200: ReminderPage, **errors(422)})
def list_reminders(
    request,
    paging: Query[Paging],
    workshop: Id | None = None,
    attendee: Id | None = None,
    status: ReminderStatus | None = None,
):
    """Reminders with their change notices, filtered by workshop, attendee and status."""
    require(request, Scope.READ)
    rows = _with_notices(Reminder.objects.order_by("pk"))
    if workshop:
        rows = rows.filter(workshop_id=workshop)
    if attendee:
        rows = rows.filter(attendee_id=attendee)
    if status:
        rows = rows.filter(status=status)
    return page_of(rows, paging, _reminder_out)


@reminders.get("/{reminder_id}", response={200: ReminderDetail, **errors(404, 422)})
def get_reminder(request, reminder_id: Path[Id]):
    """One reminder, its notices and each delivery attempt."""
    require(request, Scope.READ)
    reminder = get_or_404(_with_notices(Reminder.objects), reminder_id, "reminder")
    history = DeliveryAttempt.objects.filter(reminder=reminder).order_by("number")
    return {
        **_reminder_out(reminder),
        "history": [
            {
                "number": a.number,
                "channel": a.channel,
                "claimed_at": a.claimed_at,
                "finished_at": a.finished_at,
                "outcome": a.outcome,
                "error": a.error,
            }
            for a in history
        ],
    }
