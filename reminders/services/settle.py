"""Keep unsent reminders in step with their workshop and enrollment as they are now.

Each rule is one guarded UPDATE reading them as it runs, so whatever changed them, the next
settle puts every unsent row where they say:

1. open in a cancelled workshop or enrollment: ``cancelled``;
2. open, starting within the cutoff: ``missed`` (``unknown`` if maybe sent);
3. ``cancelled`` for its workshop or enrollment, both live again: ``pending``, or late as in 2;
   for its workshop, back on while the enrollment is cancelled: for the enrollment;
4. ``missed``, never maybe sent, with the deadline ahead again: ``pending`` (S7);
5. ``queued``, its window not open yet (moved later): ``pending``, not queued until it opens.

Nothing here can lead to a late send: the claim judges every row again.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Case, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Concat

from clock import Clock, default_clock
from reminders.models import Reminder
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services._sql import database_now
from reminders.services.fate import late_values
from workshops.models import Enrollment, Workshop

Status = Reminder.Status

# The most rows one transaction of the scan's settle locks: it bounds a claim's wait.
ROWS_PER_TRANSACTION = 250

_LIVE = Q(workshop__status=Workshop.Status.SCHEDULED, enrollment__status=Enrollment.Status.ACTIVE)
_CALLED_OFF = (reasons.WORKSHOP_CANCELLED, reasons.ENROLLMENT_CANCELLED)


def _late_reason() -> Case:
    """Why an open row is late, from what it went through: retries, the queue, or neither."""
    return Case(
        When(
            last_error__gt="",
            then=Concat(
                Value(reasons.LATE_IN_RETRY.format(error="")),
                "last_error",
                output_field=TextField(),
            ),
        ),
        When(status=Status.QUEUED, then=Value(reasons.LATE_IN_QUEUE)),
        default=Value(reasons.LATE_AT_CLAIM),
        output_field=TextField(),
    )


def reminders_settle(
    *,
    clock: Clock | None = None,
    scope: Q | None = None,
    late_reason: str | None = None,
) -> dict[str, int]:
    """Apply the module's five rules to the rows of ``scope`` (all rows by default); return counts.

    ``late_reason`` overrides the reason read from each row.
    """
    now = database_now(clock or default_clock())
    policy = ReminderPolicy.from_settings()
    rows = Reminder.objects.filter(scope) if scope is not None else Reminder.objects.all()
    open_rows = rows.filter(status__in=Reminder.OPEN_STATUSES)
    late = policy.late_start_q(now, through="workshop__")
    closed = {"queued_until": None, "next_attempt_at": None, "updated_at": now}
    counts = {"cancelled": 0, "missed": 0, "reopened": 0}
    for off, reason in (
        (~Q(workshop__status=Workshop.Status.SCHEDULED), reasons.WORKSHOP_CANCELLED),
        (~Q(enrollment__status=Enrollment.Status.ACTIVE), reasons.ENROLLMENT_CANCELLED),
    ):
        counts["cancelled"] += _update(
            open_rows.filter(off), status=Status.CANCELLED, status_reason=reason, **closed
        )
    counts["missed"] = _update(
        open_rows.filter(_LIVE, late),
        **late_values(late_reason if late_reason is not None else _late_reason()),
        **closed,
    )
    # The scan, like the plan, looks only a lead either side of now: older rows stay as they ended.
    recent = rows.filter(policy.lead_start_q(now, through="workshop__")) if scope is None else rows
    called_off = recent.filter(_LIVE, status=Status.CANCELLED, status_reason__in=_CALLED_OFF)
    reinstated = Case(
        When(status_reason=reasons.WORKSHOP_CANCELLED, then=Value(reasons.REINSTATED)),
        default=Value(""),
        output_field=TextField(),
    )
    _update(
        recent.filter(
            ~Q(enrollment__status=Enrollment.Status.ACTIVE),
            workshop__status=Workshop.Status.SCHEDULED,
            status=Status.CANCELLED,
            status_reason=reasons.WORKSHOP_CANCELLED,
        ),
        status_reason=reasons.ENROLLMENT_CANCELLED,
        updated_at=now,
    )
    counts["reopened"] = _update(
        called_off.filter(~late),
        status=Status.PENDING,
        status_reason=reinstated,
        attempts=0,
        **closed,
    )
    counts["missed"] += _update(
        called_off.filter(late),
        **late_values(
            Case(
                When(status_reason=reasons.WORKSHOP_CANCELLED, then=Value(reasons.REINSTATED_LATE)),
                default=Value(reasons.ENROLLED_LATE),
                output_field=TextField(),
            )
        ),
        attempts=0,
        **closed,
    )
    counts["reopened"] += _update(
        recent.filter(_LIVE, ~late, status=Status.MISSED, maybe_sent=False),
        status=Status.PENDING,
        status_reason=reasons.MOVED_LATER,
        **closed,
    )
    not_open_yet = ~late & ~policy.open_start_q(now, through="workshop__")
    counts["reopened"] += _update(
        open_rows.filter(_LIVE, not_open_yet, status=Status.QUEUED),
        status=Status.PENDING,
        status_reason=reasons.MOVED_LATER,
        **closed,
    )
    return counts


def _update(rows: QuerySet[Reminder], **values) -> int:
    """Run ``rows.update(**values)``: inside a caller's transaction at once, else in chunks.

    Alone, each transaction locks at most ``ROWS_PER_TRANSACTION`` rows, skipping
    those another holds; the UPDATE repeats the rule under the lock.
    """
    if connection.in_atomic_block:
        # Lock in id order first, as the claim does, so the two cannot deadlock.
        ids = list(rows.select_for_update(of=("self",)).order_by("id").values_list("id", flat=True))
        return rows.filter(id__in=ids).update(**values) if ids else 0
    total = 0
    while True:
        with transaction.atomic():
            # Ids first: in the UPDATE's subquery, LIMIT ... SKIP LOCKED may run once per row.
            chunk = list(
                rows.select_for_update(skip_locked=True, of=("self",))
                .order_by("id")
                .values_list("id", flat=True)[:ROWS_PER_TRANSACTION]
            )
            if chunk:
                total += rows.filter(id__in=chunk).update(**values)
        if len(chunk) < ROWS_PER_TRANSACTION:
            return total
