"""Plan reminders, and keep unsent ones in step with their workshop and enrollment.

``sending`` rows are left to their worker: its claim watch stops further calls
and its record re-derives the row's fate (reminders.services.fate).
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
from reminders.services._sql import database_now
from reminders.services.settle import reminders_settle
from workshops.models import Enrollment, Workshop

logger = logging.getLogger(__name__)

Status = Reminder.Status


def _in_window_workshops(*, now: datetime, policy: ReminderPolicy) -> QuerySet | None:
    """Return the enrollments of the workshops in the lead window, or None if there are none.

    On PostgreSQL the ids go as one array, so the INSERT's plan starts from their enrollments
    whatever ANALYZE sampled (joined, the planner may read every enrollment).
    """
    if connection.vendor != "postgresql":
        return Enrollment.objects.all()
    ids = list(
        Workshop.objects.filter(
            policy.lead_start_q(now), status=Workshop.Status.SCHEDULED
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
    *,
    now: datetime,
    policy: ReminderPolicy,
    enrollments: QuerySet[Enrollment],
    late_reason: str,
    whenever_started: bool,
) -> tuple[list[str], QuerySet]:
    """Return the columns the plan fills and their SELECT: a row per enrollment with no reminder.

    Planned up to a lead after the start (a reminder nobody could send shows as missed), or
    ``whenever_started``.
    """
    late = policy.late_start_q(now, through="workshop__")
    if whenever_started:
        window = Q(workshop__starts_at__lte=now + policy.lead)
    else:
        window = policy.lead_start_q(now, through="workshop__")
    values = {
        "attendee_id": F("attendee_id"),
        "workshop_id": F("workshop_id"),
        "enrollment_id": F("id"),
        "key": Concat(
            Value(f"{settings.REMINDERS_KEY_PREFIX}-w"),
            Cast("workshop_id", CharField()),
            Value("-a"),
            Cast("attendee_id", CharField()),
            output_field=CharField(),
        ),
        "status": Case(When(late, then=Value(Status.MISSED)), default=Value(Status.PENDING)),
        "status_reason": Case(When(late, then=Value(late_reason)), default=Value("")),
        "attempts": Value(0, output_field=IntegerField()),
        "last_error": Value(""),
        "channel": Value(""),
        "provider_message_id": Value(""),
        "created_at": Value(now, output_field=DateTimeField()),
        "updated_at": Value(now, output_field=DateTimeField()),
    }
    # Prefixed: an annotation may not take the name of one of the enrollment's fields.
    selected = {f"p_{column}": value for column, value in values.items()}
    return list(values), (
        enrollments.filter(
            window,
            status=Enrollment.Status.ACTIVE,
            workshop__status=Workshop.Status.SCHEDULED,
            reminders__isnull=True,
        )
        .order_by()
        .annotate(**selected)
        .values_list(*selected)
    )


def reminders_plan(
    *,
    clock: Clock | None = None,
    enrollments: QuerySet[Enrollment] | None = None,
    late_reason: str = reasons.PLANNED_LATE,
    whenever_started: bool = False,
) -> int:
    """Create the missing reminders for enrollments whose workshop starts within the lead.

    ``ON CONFLICT DO NOTHING`` makes overlapping plans create each row once. Rows past their
    deadline are created ``missed`` with ``late_reason``; ``whenever_started`` plans them however
    long ago the workshop started. Return how many were created.
    """
    clock = clock or default_clock()
    policy = ReminderPolicy.from_settings()
    now = database_now(clock)
    scanning = enrollments is None
    if scanning:
        enrollments = _in_window_workshops(now=now, policy=policy)
        if enrollments is None:
            return 0
    names, source = _plan_source(
        now=now,
        policy=policy,
        enrollments=enrollments,
        late_reason=late_reason,
        whenever_started=whenever_started,
    )
    select_sql, params = source.query.sql_with_params()
    table = connection.ops.quote_name(Reminder._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(column) for column in names)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) {select_sql} ON CONFLICT DO NOTHING", params
        )
        created = cursor.rowcount
    if created:
        logger.log(logging.INFO if scanning else logging.DEBUG, "Planned %s reminders", created)
    return created


def reminders_follow_workshop(*, workshop: Workshop, changed: frozenset[str]) -> None:
    """Bring a workshop's unsent reminders in line with its new state, in its transaction."""
    if changed == {"created"}:
        return  # no enrollment yet, so no reminder to settle or plan
    late_reason = reasons.MOVED_INSIDE_CUTOFF if "starts_at" in changed else None
    reminders_settle(scope=Q(workshop=workshop), late_reason=late_reason)
    if changed & {"starts_at", "status"}:
        reminders_plan(enrollments=Enrollment.objects.filter(workshop=workshop))


def reminders_follow_enrollment(*, enrollment: Enrollment) -> None:
    """Cancel, revive or plan the reminder of one enrollment, inside its transaction."""
    reminders_settle(scope=Q(enrollment=enrollment))
    if enrollment.status == Enrollment.Status.ACTIVE:
        reminders_plan_enrollments(ids=[enrollment.pk])


def reminders_plan_enrollments(*, ids: list[int]) -> int:
    """Plan the reminders of enrollments just created together, inside their transaction.

    However long ago their workshop started: one made on the third day of a long workshop shows
    why it got no reminder.
    """
    return reminders_plan(
        enrollments=Enrollment.objects.filter(pk__in=ids),
        late_reason=reasons.ENROLLED_LATE,
        whenever_started=True,
    )
