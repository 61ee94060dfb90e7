"""The claim: one guarded UPDATE makes one worker the single owner of the reminders it may send."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from clock import Clock, default_clock
from reminders.content import choose_text, reminder_language
from reminders.models import DeliveryAttempt, MessageText, Reminder, Suppression
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services._sql import (
    RowsWithRelated,
    StatementNow,
    claim_token_param,
    one_of,
    placeholders,
    rows_cte,
)
from reminders.services.fate import lock_in_id_order, refusal_sql
from reminders.services.feedback import suppressions_refusing
from workshops.models import Attendee, Enrollment, Workshop, WorkshopText

Status = Reminder.Status


# Each claimed reminder with its attendee, workshop and frozen text (none before its first claim).
_CLAIMED = RowsWithRelated(Reminder, ("attendee", "workshop", "text"))


@dataclass(frozen=True, slots=True)
class Claim:
    """What one worker now owns: reminders fenced by ``token`` until their lease expires."""

    token: uuid.UUID
    channel: str
    reminders: list[Reminder]
    # The DeliveryAttempt number of this claim, per reminder id (logs carry it).
    attempt_numbers: dict[int, int] = field(default_factory=dict)
    # clock.monotonic() when the claim's read began: what it returned was current at least that
    # late (ClaimWatch.seed). None only in the empty Claim of a release, which is never sent.
    read_at: float | None = None
    # Per reminder, the instant on this host's clock after which no call may start (its
    # deadline by the database's clock at the claim).
    send_by: dict[int, datetime] = field(default_factory=dict)
    # Why no call is made, per reminder whose address was suppressed when it was claimed.
    refusals: dict[int, str] = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return [reminder.pk for reminder in self.reminders]


def reminder_claim_batch(
    *,
    ids: list[int],
    channel: str,
    worker: str = "",
    clock: Clock | None = None,
    token: uuid.UUID | None = None,
    addresses: dict[int, tuple[str, str]] | None = None,
) -> Claim:
    """Make the calling worker the single owner of those of ``ids`` that may be sent now.

    One guarded UPDATE takes the rows: under READ COMMITTED a concurrent claimer blocks on the
    row lock, re-evaluates the WHERE, sees ``sending`` and changes nothing. It is the one place
    the deadline is enforced: refused ids are settled by ``_refuse``. ``token`` lets a caller
    release a claim interrupted before it returned; ``addresses``
    (``feedback.suppression_addresses``) lets PostgreSQL's statement read suppressions too.
    """
    clock = clock or default_clock()
    now = clock.now()
    token = token or uuid.uuid4()
    read_at = clock.monotonic()
    if not ids:
        return Claim(token=token, channel=channel, reminders=[], read_at=read_at)
    statement_now = StatementNow(clock, now)
    # PostgreSQL takes, reads and opens the attempts in one statement; SQLite in three.
    postgres = connection.vendor == "postgresql"
    take = _claim_read_postgres if postgres else _claim_read_sqlite
    # On PostgreSQL each step is one atomic statement, so no BEGIN/COMMIT (two round trips):
    # rows taken but not frozen when the worker or database dies are released by the caller
    # (reminders.worker.pipeline) or reaped; nothing was sent. SQLite's steps commit together.
    with nullcontext() if postgres else transaction.atomic(), connection.cursor() as cursor:
        # decided_at: when the statement decided, by the database's clock.
        claimed, numbers, decided_at, refusals = take(
            cursor,
            ids=ids,
            token=token,
            channel=channel,
            now=statement_now,
            worker=worker,
            addresses=addresses or {},
        )
        # Only an id the claim did not take can be refused for good.
        if refused := [pk for pk in ids if pk not in numbers]:
            _refuse(cursor, ids=refused, now=statement_now)
        if lost := _freeze_texts([r for r in claimed if r.text_id is None]):
            # Reaped and claimed again before this claim fixed their texts (a worker frozen
            # between the statements): the newer claim sends them.
            claimed = [reminder for reminder in claimed if reminder.pk not in lost]
            numbers = {pk: number for pk, number in numbers.items() if pk not in lost}
        if unchecked := [reminder for reminder in claimed if reminder.pk not in refusals]:
            refusals.update(suppressions_refusing(unchecked))
    # Deadlines on this host's clock: the time the database said was left, counted from this host's
    # reading before the statement, so never later than the database's deadline whatever the skew.
    policy = ReminderPolicy.from_settings()
    send_by = {
        reminder.pk: now + (policy.deadline_at(reminder.workshop.starts_at) - decided_at)
        for reminder in claimed
    }
    return Claim(
        token=token,
        channel=channel,
        reminders=claimed,
        attempt_numbers=numbers,
        read_at=read_at,
        send_by=send_by,
        refusals={pk: refusal for pk, refusal in refusals.items() if refusal is not None},
    )


# "The row is open", in a hand-written statement.
_OPEN = f"status IN ({placeholders(len(Reminder.OPEN_STATUSES))})"
_OPEN_PARAMS = [status.value for status in Reminder.OPEN_STATUSES]


def _claim_update(
    cursor, *, among: tuple[str, list], token, channel: str, now: StatementNow
) -> tuple[str, list]:
    """Return the guarded UPDATE that takes the rows ``among`` picks that may be sent now.

    Hand-written: the ORM recompiled it per chunk. It judges by ``now`` (the database's clock).
    """
    ops = cursor.db.ops
    quote = ops.quote_name
    among, among_params = among
    lease_sql, lease_params = now.plus(timedelta(seconds=settings.REMINDERS_LEASE_SECONDS))
    now_sql, now_params = now.plus()
    window, window_params = ReminderPolicy.from_settings().open_sql("starts_at", now.plus)
    workshops = quote(Workshop._meta.db_table)
    reminders = quote(Reminder._meta.db_table)
    attendees = quote(Attendee._meta.db_table)
    sql = (
        f"UPDATE {reminders} SET status = %s, claim_token = %s, "
        f"lease_expires_at = {lease_sql}, attempts = attempts + 1, channel = %s, "
        f"queued_until = NULL, next_attempt_at = NULL, updated_at = %s, "
        # What this claim's message tells the attendee, from the same snapshot (notices compare).
        "(told_starts_at, told_ends_at, told_location, told_join_url, told_cancelled) = "
        f"(SELECT starts_at, ends_at, location, join_url, FALSE FROM {workshops} "
        f"WHERE {workshops}.id = {reminders}.workshop_id), "
        # The address it goes to (its bounce suppresses that one, though corrected later).
        f"sent_to = (SELECT email FROM {attendees} WHERE {attendees}.id = {reminders}.attendee_id) "
        f"WHERE {among} "
        f"AND (next_attempt_at IS NULL OR next_attempt_at <= {now_sql}) "
        f"AND {_OPEN} "
        f"AND workshop_id IN (SELECT id FROM {workshops} "
        f"WHERE status = %s AND {window}) "
        f"AND enrollment_id IN (SELECT id FROM {quote(Enrollment._meta.db_table)} "
        "WHERE status = %s)"
    )
    params = [
        Status.SENDING.value,
        claim_token_param(token),
        *lease_params,
        channel,
        ops.adapt_datetimefield_value(now.now),
        *among_params,
        *now_params,
        *_OPEN_PARAMS,
        Workshop.Status.SCHEDULED.value,
        *window_params,
        Enrollment.Status.ACTIVE.value,
    ]
    return sql, params


def _claim_read_postgres(
    cursor, *, ids, token, channel: str, now: StatementNow, worker: str, addresses
) -> tuple[list[Reminder], dict[int, int], datetime, dict[int, str | None]]:
    """Take, read and open an attempt for those of ``ids`` that may be sent now: one statement.

    Return the reminders in send order, their attempt numbers, when the statement decided (by
    the database's clock, if ``now`` reads it), and the suppression (or None) of each whose
    address is still that of ``addresses``.
    """
    # Lock the open rows in id order first, as every writer does (a staff settle): an UPDATE
    # alone locks in its plan's order, and two orders over the same rows deadlock.
    lock, lock_params = lock_in_id_order(ids, where=_OPEN, params=_OPEN_PARAMS)
    chosen, chosen_params = one_of(connection, "id", ids)
    update, params = _claim_update(
        cursor,
        token=token,
        channel=channel,
        now=now,
        # The ids again: the planner then starts from them even while the statistics lag a
        # large plan, instead of comparing every open row with the locked ones.
        among=(f"{chosen} AND id IN (SELECT id FROM locked)", chosen_params),
    )
    reminder = connection.ops.quote_name(Reminder._meta.db_table)
    attempts, attempt_params = _attempt_insert(source="taken", worker=worker)
    # The live suppression of each row's address as the batch began, found by its key.
    keyed, keyed_params = rows_cte(
        connection,
        "keyed",
        {"id": "bigint", "key": "text"},
        [(pk, addresses[pk][1]) for pk in ids if pk in addresses],
    )
    suppressed = (
        "(SELECT s.{} FROM " + connection.ops.quote_name(Suppression._meta.db_table) + " s "
        "JOIN keyed ON keyed.key = s.address_key WHERE keyed.id = r.id AND s.lifted_at IS NULL)"
    )
    rows = _CLAIMED.read_with(
        cursor,
        prefix=(
            f"WITH locked AS MATERIALIZED ({lock}), "
            f"taken AS ({update} RETURNING {reminder}.*), "
            f"opened AS ({attempts} RETURNING reminder_id, number), {keyed} "
        ),
        source="taken",
        extra=(
            "(SELECT number FROM opened WHERE opened.reminder_id = r.id)",
            "STATEMENT_TIMESTAMP()",
            suppressed.format("cause"),
            suppressed.format("caused_at"),
        ),
        order="j1.starts_at, r.id",
        params=[*lock_params, *params, *attempt_params, *keyed_params],
    )
    decided_at = rows[0][1][1] if rows and now.database else now.now
    refusals = {
        base.pk: Suppression(cause=cause, caused_at=caused_at).refusal if cause else None
        for base, (_, _, cause, caused_at) in rows
        if base.pk in addresses and addresses[base.pk][0] == base.attendee.email
    }
    return (
        [base for base, _ in rows],
        {base.pk: number for base, (number, *_) in rows},
        decided_at,
        refusals,
    )


def _claim_read_sqlite(
    cursor, *, ids, token, channel: str, now: StatementNow, worker: str, addresses
) -> tuple[list[Reminder], dict[int, int], datetime, dict[int, str | None]]:
    """``_claim_read_postgres`` in three statements, in the caller's transaction.

    ``addresses`` is not read: the caller checks the suppressions of every row claimed.
    """
    update, params = _claim_update(
        cursor,
        among=one_of(cursor.db, "id", ids),
        token=token,
        channel=channel,
        now=now,
    )
    cursor.execute(f"{update} RETURNING id", params)
    if not cursor.fetchall():
        return [], {}, now.now, {}
    claimed = "r.claim_token = %s"
    fence = [claim_token_param(token)]
    reminders = _CLAIMED.read(cursor, where=claimed, order="j1.starts_at, r.id", params=fence)
    reminder = connection.ops.quote_name(Reminder._meta.db_table)
    insert, params = _attempt_insert(source=reminder, worker=worker)
    cursor.execute(f"{insert} WHERE {claimed} RETURNING reminder_id, number", [*params, *fence])
    return reminders, dict(cursor.fetchall()), now.now, {}


def _refuse(cursor, *, ids, now: StatementNow) -> None:
    """Settle those of the refused ``ids`` that can never be sent (``fate.refusal_sql``)."""
    settle, settle_params = refusal_sql(reasons.LATE_AT_CLAIM, now=now)
    among, among_params = one_of(cursor.db, "r.id", ids)
    prefix, prefix_params = "", []
    if cursor.db.vendor == "postgresql":
        # In id order, as the claim's own.
        lock, prefix_params = lock_in_id_order(ids, where=_OPEN, params=_OPEN_PARAMS)
        prefix, among = (
            f"WITH locked AS MATERIALIZED ({lock}) ",
            f"{among} AND r.id IN (SELECT id FROM locked)",
        )
    cursor.execute(
        f"{prefix}{settle} AND {among} AND r.{_OPEN}",
        [*prefix_params, *settle_params, *among_params, *_OPEN_PARAMS],
    )


def _freeze_texts(reminders: list[Reminder]) -> set[int]:
    """Fix the text of first-claimed reminders; return the ids a newer claim fixed first.

    A fixed text is never replaced: every later send renders from it. One statement when the
    texts are stored; two more for a new text.
    """
    if not reminders:
        return set()
    # Other-language texts matter only to attendees whose language is not their workshop's.
    languages = {
        reminder.pk: reminder_language(workshop=reminder.workshop, attendee=reminder.attendee)
        for reminder in reminders
    }
    texts: dict[int, dict[str, WorkshopText]] = {}
    others = {r.workshop_id for r in reminders if languages[r.pk] != r.workshop.language}
    for text in WorkshopText.objects.filter(workshop_id__in=others) if others else ():
        texts.setdefault(text.workshop_id, {})[text.language] = text
    # The text depends on the attendee only through the language: chosen once per workshop and
    # language (one statement read every workshop row, so its copies agree).
    by_language: dict[tuple[int, str], MessageText] = {}
    chosen = {}
    for reminder in reminders:
        key = (reminder.workshop_id, languages[reminder.pk])
        if key not in by_language:
            by_language[key] = choose_text(
                workshop=reminder.workshop,
                attendee=reminder.attendee,
                texts=texts.get(reminder.workshop_id, {}),
            )
        chosen[reminder.pk] = by_language[key]
    rows = {row.digest: row for row in chosen.values()}
    pointed = _point_at_texts(chosen)
    if unpointed := {pk: row for pk, row in chosen.items() if pk not in pointed}:
        # Only a new text's first batch writes. Of two concurrent inserts one wins, the other
        # does nothing and points at the winner's; no existing row is locked or rewritten.
        missing = {row.digest: rows[row.digest] for row in unpointed.values()}
        MessageText.objects.bulk_create(
            [missing[digest] for digest in sorted(missing)], ignore_conflicts=True
        )
        pointed.update(_point_at_texts(unpointed))
    for reminder in reminders:
        if reminder.pk in pointed:
            row = rows[chosen[reminder.pk].digest]
            row.pk, row._state.adding = pointed[reminder.pk], False
            reminder.text = row
    return {reminder.pk for reminder in reminders if reminder.pk not in pointed}


def _point_at_texts(chosen: dict[int, MessageText]) -> dict[int, int]:
    """Point each reminder of ``chosen`` at its stored text; return text ids by reminder id.

    A text not stored yet, or one fixed already, is left out. RETURNING names the reminder's
    own columns only, as SQLite requires.
    """
    reminder_table = connection.ops.quote_name(Reminder._meta.db_table)
    text_table = connection.ops.quote_name(MessageText._meta.db_table)
    pairs = [(pk, row.digest) for pk, row in chosen.items()]
    wanted, params = rows_cte(connection, "v", {"id": "bigint", "digest": "text"}, pairs)
    source, unfixed = "v", f"{reminder_table}.text_id IS NULL"
    if connection.vendor == "postgresql":
        # Autocommit after the claim: lock the rows in id order, as every writer does. The lock
        # re-checks that a row has no text yet, so the UPDATE need not: a condition on text_id
        # lets the planner start from every row without one, while the statistics lag a plan.
        lock, lock_params = lock_in_id_order(
            chosen, where="text_id IS NULL", params=[], mode="NO KEY UPDATE"
        )
        wanted += f", locked AS MATERIALIZED ({lock})"
        params += lock_params
        source, unfixed = "locked JOIN v ON v.id = locked.id", "TRUE"
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {wanted} UPDATE {reminder_table} SET text_id = t.id "
            f"FROM {source} JOIN {text_table} t ON t.digest = v.digest "
            f"WHERE {reminder_table}.id = v.id AND {unfixed} "
            f"RETURNING {reminder_table}.id, {reminder_table}.text_id",
            params,
        )
        return dict(cursor.fetchall())


def _attempt_insert(*, source: str, worker: str) -> tuple[str, list]:
    """Return the INSERT of one in-flight DeliveryAttempt per row of ``source`` (alias ``r``).

    Numbered after the reminder's highest attempt, not ``Reminder.attempts``: that goes down
    when a claim is refunded, and the history must stay append-only and uniquely numbered.
    """
    attempt = connection.ops.quote_name(DeliveryAttempt._meta.db_table)
    sql = (
        f"INSERT INTO {attempt} (reminder_id, number, claim_token, channel, worker, "
        "claimed_at, lease_expires_at, finished_at, outcome, provider_calls, error, "
        "provider_message_id) "
        f"SELECT r.id, COALESCE((SELECT MAX(a.number) FROM {attempt} a "
        "WHERE a.reminder_id = r.id), 0) + 1, r.claim_token, r.channel, %s, "
        "r.updated_at, r.lease_expires_at, NULL, %s, 0, '', '' "
        f"FROM {source} r"
    )
    return sql, [worker[:200], DeliveryAttempt.Outcome.IN_FLIGHT.value]
