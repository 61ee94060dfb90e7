"""Plan reminders, and keep unsent ones in step with their workshop and enrollment.

``reminders_plan`` creates rows; ``reminders_follow_workshop`` and
``reminders_follow_enrollment`` run inside the workshops app's transactions
(through workshops.signals) when staff cancel, move or re-enrol. Rows that a
worker holds (``sending``) are left to that worker: it learns of the change
before its next provider call (reminders.bridge's claim watch) and its record
re-derives the row's fate (reminders.services.fate).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    CharField,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Concat

from clock import Clock, default_clock
from reminders.models import Reminder
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services.fate import (
    late_values,
    reminder_fate,
    reminders_return,
    sources_locked,
)
from workshops.models import Enrollment, Workshop

logger = logging.getLogger(__name__)

Status = Reminder.Status

# Columns the plan fills, in the order of its SELECT list.
_PLAN_COLUMNS = (
    "attendee_id",
    "workshop_id",
    "enrollment_id",
    "key",
    "status",
    "status_reason",
    "window_opens_at",
    "deadline_at",
    "attempts",
    "last_error",
    "channel",
    "provider_message_id",
    "created_at",
    "updated_at",
)


def _in_window_workshops(*, now: datetime, policy: ReminderPolicy) -> QuerySet | None:
    """Return the enrollments of the workshops in the lead window, by an explicit id list.

    The scan's plan reads those workshops first (``workshop_status_start``)
    and hands PostgreSQL their ids as one array, so the INSERT's plan starts
    from the window's enrollments (``enrollment_workshop_status``) whatever
    ANALYZE sampled. Joined instead, the planner sometimes read every
    enrollment and looked each workshop up by primary key: 2-3 s at a million
    enrollments instead of a few hundred ms (docs/benchmarks.md,
    bench/scan_million.py). Return None when no workshop is in the window.
    On SQLite (the local run) the join stays.
    """
    if connection.vendor != "postgresql":
        return Enrollment.objects.all()
    ids = list(
        Workshop.objects.filter(
            status=Workshop.Status.SCHEDULED,
            starts_at__gt=now - policy.lead,
            starts_at__lte=now + policy.lead,
        ).values_list("id", flat=True)
    )
    if not ids:
        return None
    column = ".".join(
        connection.ops.quote_name(name) for name in (Enrollment._meta.db_table, "workshop_id")
    )
    return Enrollment.objects.filter(
        RawSQL(f"{column} = ANY(%s)", [ids], output_field=BooleanField())
    )


def _plan_source(
    *, now: datetime, policy: ReminderPolicy, enrollments: QuerySet[Enrollment], late_reason: str
) -> QuerySet:
    """Return the SELECT feeding the plan: one row per enrollment lacking a reminder."""
    starts = F("workshop__starts_at")
    deadline = ExpressionWrapper(
        starts - Value(policy.cutoff, output_field=DurationField()), output_field=DateTimeField()
    )
    window = ExpressionWrapper(
        starts - Value(policy.lead, output_field=DurationField()), output_field=DateTimeField()
    )
    late = policy.late_start_q(now, through="workshop__")
    return (
        enrollments.filter(
            status=Enrollment.Status.ACTIVE,
            workshop__status=Workshop.Status.SCHEDULED,
            # Workshops that started less than a lead ago are still planned, so
            # a reminder nobody could send shows up as missed, not as nothing.
            workshop__starts_at__gt=now - policy.lead,
            workshop__starts_at__lte=now + policy.lead,
            reminders__isnull=True,
        )
        .order_by()
        .annotate(
            p_attendee=F("attendee_id"),
            p_workshop=F("workshop_id"),
            p_enrollment=F("id"),
            p_key=Concat(
                Value(f"{settings.REMINDERS_KEY_PREFIX}-w"),
                Cast("workshop_id", CharField()),
                Value("-a"),
                Cast("attendee_id", CharField()),
                output_field=CharField(),
            ),
            p_status=Case(When(late, then=Value(Status.MISSED)), default=Value(Status.PENDING)),
            p_reason=Case(When(late, then=Value(late_reason)), default=Value("")),
            p_window=window,
            p_deadline=deadline,
            p_attempts=Value(0, output_field=IntegerField()),
            p_error=Value(""),
            p_channel=Value(""),
            p_message_id=Value(""),
            p_created=Value(now, output_field=DateTimeField()),
            p_updated=Value(now, output_field=DateTimeField()),
        )
        .values_list(
            "p_attendee",
            "p_workshop",
            "p_enrollment",
            "p_key",
            "p_status",
            "p_reason",
            "p_window",
            "p_deadline",
            "p_attempts",
            "p_error",
            "p_channel",
            "p_message_id",
            "p_created",
            "p_updated",
        )
    )


def reminders_plan(
    *,
    clock: Clock | None = None,
    policy: ReminderPolicy | None = None,
    enrollments: QuerySet[Enrollment] | None = None,
    late_reason: str = reasons.PLANNED_LATE,
) -> int:
    """Create the missing reminders for enrollments whose workshop starts within the lead.

    One ``INSERT ... SELECT ... ON CONFLICT DO NOTHING`` statement, whatever the
    number of workshops (for the scan, after one read of the ids of the
    workshops in the window: ``_in_window_workshops``); the unique constraint
    on (attendee, workshop) decides
    between concurrent scans, so two overlapping plans create each row once.
    Reminders whose deadline has already passed are created as ``missed``
    with ``late_reason``, never as sendable. Return how many rows were created.
    """
    clock = clock or default_clock()
    policy = policy or ReminderPolicy.from_settings()
    now = clock.now()
    if enrollments is None:
        enrollments = _in_window_workshops(now=now, policy=policy)
        if enrollments is None:
            return 0
    source = _plan_source(now=now, policy=policy, enrollments=enrollments, late_reason=late_reason)
    select_sql, params = source.query.sql_with_params()
    table = connection.ops.quote_name(Reminder._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(column) for column in _PLAN_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) {select_sql} ON CONFLICT DO NOTHING", params
        )
        created = cursor.rowcount
    if created:
        logger.log(
            logging.INFO if enrollments is None else logging.DEBUG, "Planned %s reminders", created
        )
    return created


def reminders_follow_workshop(
    *, workshop: Workshop, changed: frozenset[str], clock: Clock | None = None
) -> None:
    """Bring a workshop's unsent reminders in line with its new state.

    Runs inside the workshop service's transaction (workshops.signals), which
    has already written the workshop row and holds its lock until commit.
    Guarantee: every ``pending`` or ``queued`` row of the workshop leaves this
    function with the status, window and deadline of the workshop as it is
    now; a ``missed`` row whose new deadline is still ahead is planned again,
    unless its enrollment is cancelled or it may have reached the provider
    (``maybe_sent``).
    ``sending`` rows are their worker's (see the module docstring).
    """
    clock = clock or default_clock()
    now = clock.now()
    mine = Reminder.objects.filter(workshop=workshop)
    if workshop.status == Workshop.Status.CANCELLED:
        _cancel_open(mine, reason=reasons.WORKSHOP_CANCELLED, now=now)
        return
    if "status" in changed:
        _reinstate(mine, now=now)
    if "starts_at" in changed:
        _reschedule(workshop=workshop, reminders=mine, now=now)
    if changed & {"starts_at", "created"}:
        reminders_plan(clock=clock, enrollments=Enrollment.objects.filter(workshop=workshop))


def _reinstate(reminders: QuerySet[Reminder], *, now: datetime) -> None:
    """Re-derive the fate of the cancelled rows of a workshop that is scheduled again.

    Each goes back to ``pending`` with the current window and deadline, or to
    ``missed`` when the cutoff has passed (``unknown`` if it may have reached
    the provider); a row whose enrollment is cancelled stays cancelled. Sent,
    failed and unknown rows are left as they are.
    """
    cancelled = Q(status=Status.CANCELLED)
    policy = ReminderPolicy.from_settings()
    sources = sources_locked(reminders.filter(cancelled).values_list("pk", flat=True))
    fates = {
        pk: reminder_fate(
            source=source,
            policy=policy,
            now=now,
            late_reason=reasons.REINSTATED_LATE,
            open_reason=reasons.REINSTATED,
        )
        for pk, source in sources.items()
    }
    reopened = {pk: fate for pk, fate in fates.items() if fate.status != Status.CANCELLED}
    reminders_return(fates=reopened, guard=cancelled, now=now, extra={"attempts": 0})


def _cancel_open(reminders: QuerySet[Reminder], *, reason: str, now: datetime) -> None:
    """Cancel the ``pending`` and ``queued`` rows; ``sending`` ones are their worker's."""
    reminders.filter(status__in=Reminder.OPEN_STATUSES).update(
        status=Status.CANCELLED,
        status_reason=reason,
        queued_until=None,
        next_attempt_at=None,
        updated_at=now,
    )


def _reschedule(*, workshop: Workshop, reminders: QuerySet[Reminder], now: datetime) -> None:
    policy = ReminderPolicy.from_settings()
    schedule = {
        "window_opens_at": policy.window_opens_at(workshop.starts_at),
        "deadline_at": policy.deadline_at(workshop.starts_at),
        "updated_at": now,
    }
    open_rows = reminders.filter(status__in=Reminder.OPEN_STATUSES)
    if policy.is_late(deadline_at=schedule["deadline_at"], now=now):
        open_rows.update(
            **late_values(reasons.MOVED_INSIDE_CUTOFF),
            queued_until=None,
            next_attempt_at=None,
            **schedule,
        )
        reminders.filter(status=Status.MISSED).update(**schedule)
        return
    open_rows.update(**schedule)
    # Missed under the old start (inside the cutoff, or an outage) but the
    # workshop now starts later: it can still be sent, so it is planned again.
    # Not a row that may have reached the provider (``unknown``, or ``missed``
    # marked by migration 0015): a second send could carry the old start under
    # the same key, or reach the attendee twice; staff decide those.
    reminders.filter(
        status=Status.MISSED, maybe_sent=False, enrollment__status=Enrollment.Status.ACTIVE
    ).update(
        status=Status.PENDING,
        status_reason=reasons.MOVED_LATER,
        queued_until=None,
        next_attempt_at=None,
        **schedule,
    )


def reminders_follow_enrollment(*, enrollment: Enrollment, clock: Clock | None = None) -> None:
    """Cancel or (re)plan the reminder of one enrollment, inside its transaction."""
    clock = clock or default_clock()
    now = clock.now()
    if enrollment.status == Enrollment.Status.CANCELLED:
        _cancel_open(
            Reminder.objects.filter(enrollment=enrollment),
            reason=reasons.ENROLLMENT_CANCELLED,
            now=now,
        )
        return
    # Re-enrolled after cancelling: the cancelled reminder becomes sendable
    # again if its deadline allows, else it says why it will not be sent.
    policy = ReminderPolicy.from_settings()
    workshop = enrollment.workshop
    deadline = policy.deadline_at(workshop.starts_at)
    revived = Reminder.objects.filter(
        enrollment=enrollment,
        status=Status.CANCELLED,
        status_reason=reasons.ENROLLMENT_CANCELLED,
    )
    schedule = {
        "window_opens_at": policy.window_opens_at(workshop.starts_at),
        "deadline_at": deadline,
        "updated_at": now,
    }
    if not policy.is_late(deadline_at=deadline, now=now):
        revived.update(status=Status.PENDING, status_reason="", **schedule)
    else:
        revived.update(**late_values(reasons.ENROLLED_LATE), **schedule)
    reminders_plan(
        clock=clock,
        enrollments=Enrollment.objects.filter(pk=enrollment.pk),
        late_reason=reasons.ENROLLED_LATE,
    )
