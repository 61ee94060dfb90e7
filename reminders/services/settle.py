"""Keep unsent reminders in step with their workshop and enrollment as they are now.

A row stores no copy of its workshop's time or status: each rule below is one
guarded UPDATE whose WHERE reads the workshop and enrollment rows when the
statement runs. Whatever changed them (a staff action, a bulk ``update()`` in
a shell, a load, a race that overtook another writer's read), the next settle
puts every unsent row where the facts say:

1. open (``pending``, ``queued``) in a cancelled workshop or enrollment:
   ``cancelled``;
2. open with the workshop starting within the cutoff: ``missed`` (``unknown``
   when a call may have reached the provider: fate.late_values);
3. ``cancelled`` for its workshop or enrollment, both live again: ``pending``,
   or late as in 2;
4. ``missed`` (never maybe sent) with live sources and the deadline of the
   current start ahead: ``pending`` again (FAULTS S7).

The scan runs it over every row, 3 and 4 over the workshops that start
within a lead of now either side (``ROWS_PER_TRANSACTION`` at a time, skipping
rows a claim holds: the claim decides those itself); a staff change runs it
for its own workshop or enrollment inside its transaction, so the admin
shows the result at once. Nothing here can lead to a late send: the claim
judges every row again, from the workshop's start, when it takes it.
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

# The most rows one transaction of the scan's settle locks. A claim that meets a
# row the scan holds waits for that transaction, so this bounds the wait
# (bench/scan_million.py measures it).
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
    """Apply the module's four rules to the rows of ``scope`` (all rows by default).

    ``late_reason`` names why rows are late (a staff move inside the cutoff);
    by default it is read from each row (retrying, queued, or neither).
    Return how many rows were ``cancelled``, ``missed`` (or ``unknown``) and
    ``reopened``.
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
    # Over every row (the scan), only workshops that start within a lead of now
    # either side, as the plan does: older rows stay as they ended.
    recent = (
        rows.filter(
            workshop__starts_at__gt=now - policy.lead, workshop__starts_at__lte=now + policy.lead
        )
        if scope is None
        else rows
    )
    called_off = recent.filter(_LIVE, status=Status.CANCELLED, status_reason__in=_CALLED_OFF)
    reinstated = Case(
        When(status_reason=reasons.WORKSHOP_CANCELLED, then=Value(reasons.REINSTATED)),
        default=Value(""),
        output_field=TextField(),
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
    return counts


def _update(rows: QuerySet[Reminder], **values) -> int:
    """Run ``rows.update(**values)``: inside a caller's transaction at once, else in chunks.

    Alone (the scan), each transaction locks at most ``ROWS_PER_TRANSACTION``
    rows, skipping those another transaction holds, so a claim never waits
    long behind the settle; the UPDATE repeats the rule under the lock.
    """
    if connection.in_atomic_block:
        # A staff change's transaction: lock the rows in id order first, as the
        # claim does, so the two never hold each other's rows (a deadlock).
        ids = list(rows.select_for_update(of=("self",)).order_by("id").values_list("id", flat=True))
        return rows.filter(id__in=ids).update(**values) if ids else 0
    total = 0
    while True:
        with transaction.atomic():
            # The ids first, then the UPDATE: as a subquery of the UPDATE, PostgreSQL
            # may run a LIMIT ... SKIP LOCKED once per row and take every row.
            chunk = list(
                rows.select_for_update(skip_locked=True, of=("self",))
                .order_by("id")
                .values_list("id", flat=True)[:ROWS_PER_TRANSACTION]
            )
            if chunk:
                total += rows.filter(id__in=chunk).update(**values)
        if len(chunk) < ROWS_PER_TRANSACTION:
            return total
