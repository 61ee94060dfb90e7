"""A reminder's fate, re-derived from its workshop and enrollment as they are now.

``sources_locked`` reads those ``FOR SHARE``: a cancel or move either committed first and is
seen, or waits for the returning transaction. Lock order everywhere: attendee, workshop,
enrollment, reminder, delivery attempt. Writers that may meet on the same ``sending`` rows
lock them in id order first: two UPDATEs locking them in their plans' orders can deadlock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Case, CharField, Expression, F, Q, Value, When
from django.db.models.functions import Concat, Left
from django.db.transaction import TransactionManagementError

from reminders.models import Reminder
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services._sql import array_literal, update_returning
from workshops.models import Enrollment, Workshop

Status = Reminder.Status


@dataclass(frozen=True, slots=True)
class Source:
    """The facts a reminder's fate is derived from, as committed now."""

    workshop_status: str
    enrollment_status: str
    starts_at: datetime
    #: An earlier call, in any claim, got no definite answer (Reminder.maybe_sent).
    maybe_sent: bool = False


@dataclass(frozen=True, slots=True)
class Fate:
    """Where a returning reminder goes, and when it may be tried again."""

    status: str
    reason: str
    next_attempt_at: datetime | None = None
    #: Written to Reminder.maybe_sent (set, never cleared) with the fate.
    maybe_sent: bool = False


def reminder_fate(
    *,
    source: Source,
    policy: ReminderPolicy,
    now: datetime,
    late_reason: str,
    retry_at: datetime | None = None,
    open_reason: str = "",
    maybe_sent: bool = False,
    gave_up: str = "",
) -> Fate:
    """Return the fate of a reminder going back towards delivery (pure).

    If the provider may hold it (``maybe_sent``), ``unknown`` replaces ``failed`` and ``missed``.
    """
    deadline = policy.deadline_at(source.starts_at)
    maybe_sent = maybe_sent or source.maybe_sent
    if source.workshop_status != Workshop.Status.SCHEDULED:
        return Fate(Status.CANCELLED, reasons.WORKSHOP_CANCELLED, maybe_sent=maybe_sent)
    if source.enrollment_status != Enrollment.Status.ACTIVE:
        return Fate(Status.CANCELLED, reasons.ENROLLMENT_CANCELLED, maybe_sent=maybe_sent)
    if gave_up:
        if maybe_sent:
            reason = reasons.MAYBE_SENT_NOT_RETRIED.format(why=gave_up)
            return Fate(Status.UNKNOWN, reason, maybe_sent=True)
        return Fate(Status.FAILED, gave_up)
    if policy.is_late(deadline_at=deadline, now=max(now, retry_at or now)):
        if maybe_sent:
            reason = reasons.MAYBE_SENT_NOT_RETRIED.format(why=late_reason)
            return Fate(Status.UNKNOWN, reason, maybe_sent=True)
        return Fate(Status.MISSED, late_reason)
    return Fate(Status.PENDING, open_reason, retry_at, maybe_sent=maybe_sent)


def late_values(reason: str | Expression) -> dict[str, Expression]:
    """Return SET values giving late open rows with live sources ``missed`` (or ``unknown``)."""
    if isinstance(reason, str):
        reason = Value(reason)
    prefix = Value(reasons.MAYBE_SENT_NOT_RETRIED.format(why=""))
    maybe = Q(maybe_sent=True)
    return {
        "status": Case(
            When(maybe, then=Value(Status.UNKNOWN.value)),
            default=Value(Status.MISSED.value),
            output_field=CharField(),
        ),
        "status_reason": Case(
            When(maybe, then=Left(Concat(prefix, reason, output_field=CharField()), 200)),
            default=Left(reason, 200),
            output_field=CharField(),
        ),
    }


def refusal_sql(late_reason: str, *, now) -> tuple[str, list]:
    """Return ``(sql, params)`` of an UPDATE giving rows that can never be sent their fate.

    As ``reminder_fate``: ``cancelled``, else ``missed`` (or ``unknown``) within the cutoff;
    others are left. ``now`` is a ``StatementNow``; the caller appends ``AND ...`` on ``r``.
    """
    quote = connection.ops.quote_name
    stamp = connection.ops.adapt_datetimefield_value
    policy = ReminderPolicy.from_settings()
    late, late_params = policy.late_sql("w.starts_at", now.plus)
    maybe_reason = reasons.MAYBE_SENT_NOT_RETRIED.format(why=late_reason)[:200]
    off_workshop = "w.status <> %s"
    off_enrollment = "e.status <> %s"
    live = [Workshop.Status.SCHEDULED.value, Enrollment.Status.ACTIVE.value]
    sql = (
        f"UPDATE {quote(Reminder._meta.db_table)} AS r SET "
        f"status = CASE WHEN {off_workshop} OR {off_enrollment} THEN %s "
        "WHEN r.maybe_sent THEN %s ELSE %s END, "
        f"status_reason = CASE WHEN {off_workshop} THEN %s WHEN {off_enrollment} THEN %s "
        "WHEN r.maybe_sent THEN %s ELSE %s END, "
        "queued_until = NULL, next_attempt_at = NULL, updated_at = %s "
        f"FROM {quote(Workshop._meta.db_table)} w, {quote(Enrollment._meta.db_table)} e "
        "WHERE w.id = r.workshop_id AND e.id = r.enrollment_id "
        f"AND ({off_workshop} OR {off_enrollment} OR {late})"
    )
    params = [
        *live,
        Status.CANCELLED.value,
        Status.UNKNOWN.value,
        Status.MISSED.value,
        live[0],
        reasons.WORKSHOP_CANCELLED,
        live[1],
        reasons.ENROLLMENT_CANCELLED,
        maybe_reason,
        late_reason[:200],
        stamp(now.now),
        *live,
        *late_params,
    ]
    return sql, params


def sources_locked(ids: Iterable[int]) -> dict[int, Source]:
    """Return the current workshop and enrollment facts of each reminder in ``ids``.

    On PostgreSQL they stay locked ``FOR SHARE`` until the caller's ``atomic`` ends.
    """
    ids = sorted(set(ids))
    if not ids:
        return {}
    if connection.vendor != "postgresql":
        rows = Reminder.objects.filter(pk__in=ids).values_list(
            "pk", "workshop__status", "enrollment__status", "workshop__starts_at", "maybe_sent"
        )
        return {pk: Source(*facts) for pk, *facts in rows}
    quote = connection.ops.quote_name
    sql = (
        f"SELECT r.id, w.status, e.status, w.starts_at, r.maybe_sent "
        f"FROM {quote(Reminder._meta.db_table)} r "
        f"JOIN {quote(Workshop._meta.db_table)} w ON w.id = r.workshop_id "
        f"JOIN {quote(Enrollment._meta.db_table)} e ON e.id = r.enrollment_id "
        f"WHERE r.id = ANY(%s) ORDER BY w.id, e.id FOR SHARE OF w, e"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [ids])
        return {pk: Source(*facts) for pk, *facts in cursor.fetchall()}


def reminders_locked(ids: Iterable[int], guard: Q) -> None:
    """Lock the reminders of ``ids`` that match ``guard``, ``FOR UPDATE`` in id order.

    Call it inside ``atomic``, after ``sources_locked`` and before the UPDATEs.
    """
    ids = sorted(set(ids))
    if ids and connection.vendor == "postgresql":
        list(
            Reminder.objects.filter(guard, pk__in=ids)
            .select_for_update()
            .order_by("pk")
            .values_list("pk", flat=True)
        )


def lock_in_id_order(ids: Iterable[int], *, where: str, params: list, mode: str = "UPDATE"):
    """Return ``(sql, params)`` locking the reminders of ``ids`` matching ``where``, in id order.

    Run it alone in a transaction, or as a ``MATERIALIZED`` CTE a one-statement writer joins.
    """
    table = connection.ops.quote_name(Reminder._meta.db_table)
    # Row by row by primary key, in the array's order: a plain WHERE lets the planner scan an
    # index of ``where`` instead, every open row, while the statistics lag a large plan. Inside
    # ``IS TRUE`` no index can serve ``where``, so none is taken for the primary key, however
    # small (a table vacuumed empty keeps its indexes' sizes).
    sql = (
        f"SELECT r.id FROM unnest(%s::bigint[]) WITH ORDINALITY AS v(id, n) CROSS JOIN LATERAL "
        f"(SELECT id FROM {table} WHERE id = v.id AND ({where}) IS TRUE FOR {mode}) r "
        "ORDER BY v.n"
    )
    return sql, [array_literal(sorted(set(ids)), "bigint"), *params]


def claimed_locked(ids: Collection[int], token) -> None:
    """``reminders_locked`` for the rows still ``sending`` under the claim ``token``, in raw SQL."""
    if ids and connection.vendor == "postgresql":
        if not connection.in_atomic_block:
            # Outside a transaction the lock would end at once.
            raise TransactionManagementError("claimed_locked() must run inside atomic()")
        with connection.cursor() as cursor:
            cursor.execute(*lock_in_id_order(ids, where="claim_token = %s", params=[token]))


def reminders_return(
    *,
    fates: Mapping[int, Fate],
    guard: Q,
    now: datetime,
    errors: Mapping[int, str] | None = None,
    refund: Iterable[int] = (),
    extra: Mapping[str, object] | None = None,
) -> dict[int, str]:
    """Write each reminder's fate with a guarded UPDATE; return ``{id: status}`` of rows changed.

    One statement per fate; ``refund`` gives back the claim's attempt; ``extra`` adds the same
    values to every row.
    """
    errors = errors or {}
    refund = set(refund)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for pk, fate in fates.items():
        key = (
            fate.status, fate.reason, fate.next_attempt_at, errors.get(pk), pk in refund,
            fate.maybe_sent,
        )  # fmt: skip
        groups[key].append(pk)
    changed: dict[int, str] = {}
    for (status, reason, next_attempt_at, error, refunded, maybe_sent), ids in groups.items():
        values = {
            "status": status,
            "status_reason": reason[:200],
            "next_attempt_at": next_attempt_at,
            "queued_until": None,
            "claim_token": None,
            "lease_expires_at": None,
            "updated_at": now,
        }
        if error is not None:
            values["last_error"] = error
        if refunded:
            values["attempts"] = F("attempts") - 1
        if maybe_sent:
            values["maybe_sent"] = True  # set, never cleared
        values.update(extra or {})
        changed.update(update_returning(Reminder.objects.filter(guard, pk__in=ids), **values))
    return changed
