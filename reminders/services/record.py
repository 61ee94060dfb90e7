"""What a worker writes after its provider calls: the record of each outcome, or a release.

Both are fenced by the claim (``claim_token = <this claim> AND status =
'sending'``): a worker whose lease was reaped, and whose reminder may now
belong to a newer claim, changes nothing. Outcomes that end the reminder
(``sent``, ``failed``, ``unknown``) are written as they are; every other
outcome hands the reminder back, and its fate is re-derived from the workshop
and enrollment as they are now (reminders.services.fate).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from clock import Clock, default_clock
from delivery.redact import redact_text
from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services._sql import claim_token_param, database_now, rows_cte
from reminders.services.claim import Claim
from reminders.services.fate import (
    claimed_locked,
    lock_in_id_order,
    reminder_fate,
    reminders_locked,
    reminders_return,
    sources_locked,
)
from reminders.services.personal import erased_among, personal_words, scrubber

Status = Reminder.Status
Attempt = DeliveryAttempt.Outcome

# Channels whose provider deduplicates by the reminder's key: a send whose
# outcome is unknown may be repeated with the same key without a duplicate.
CHANNELS_HONOURING_KEYS = frozenset({"http", "file"})


def channel_honours_keys(channel: str) -> bool:
    return channel in CHANNELS_HONOURING_KEYS


def retry_delay(attempts: int) -> timedelta:
    """Return how long a reminder waits before its next claim after ``attempts`` claims."""
    base = settings.REMINDERS_RETRY_BASE
    return timedelta(seconds=min(settings.REMINDERS_RETRY_MAX, base * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one delivery result means for its reminder's row.

    ``status`` is final (``sent``, ``failed``, ``unknown``) or ``pending``,
    which means "hand it back": the fate then decides between ``pending``,
    ``missed`` (with ``late_reason``; ``unknown`` if ``maybe_sent``),
    ``failed`` at the attempt cap (``gave_up``; ``unknown`` if ``maybe_sent``)
    and ``cancelled``, which wins over both.
    """

    status: str
    attempt_outcome: str
    reason: str = ""
    error: str = ""
    message_id: str = ""
    retry_at: datetime | None = None
    refund_attempt: bool = False
    late_reason: str = ""
    #: A call may have reached the provider (a keyed channel: retrying is safe, but a
    #: reminder not tried again is ``unknown``, not ``missed``: reminder_fate).
    maybe_sent: bool = False
    #: The attempt cap was reached (why): ``failed``, or ``unknown`` if maybe sent, unless
    #: the fate finds it cancelled.
    gave_up: str = ""

    @property
    def returns(self) -> bool:
        return self.status == Status.PENDING


_ATTEMPT_OUTCOMES = {
    Outcome.SENT: Attempt.SENT,
    Outcome.TRANSIENT: Attempt.TRANSIENT,
    Outcome.PERMANENT: Attempt.PERMANENT,
    Outcome.TIMED_OUT: Attempt.TIMED_OUT,
    Outcome.CANCELLED: Attempt.CANCELLED,
    Outcome.EXPIRED: Attempt.NOT_STARTED,
    Outcome.WITHDRAWN: Attempt.WITHDRAWN,
}


def reminder_verdict(
    *, result: DeliveryResult, reminder: Reminder, channel: str, now: datetime
) -> Verdict:
    """Decide what becomes of a claimed reminder from its delivery result (pure).

    A result that may have reached the provider on a channel without keys is
    ``unknown`` whatever else it says (a "permanent" error after an ambiguous
    call included): marking it ``failed`` would invite a replay that sends it
    twice. On a channel with keys it goes back to be tried again with the same
    key, unless the provider refused it (``unknown`` then: a refusal does not
    say the call with no answer never arrived); the fate then finds whether it
    cannot be (its deadline, the attempt cap): ``unknown`` too, since "failed"
    or "missed" would say it was not delivered, unless it is ``cancelled``. The
    row's own ``maybe_sent`` (a call of an earlier claim got no answer) counts
    the same, and makes a refusal (any channel) ``unknown`` rather than
    ``failed``.
    """
    outcome = result.outcome
    error = redact_text(result.error)  # whatever the channel quoted, no secret is stored
    attempt_outcome = _ATTEMPT_OUTCOMES[outcome]
    if outcome == Outcome.SENT:
        return Verdict(Status.SENT, attempt_outcome, message_id=result.message_id or "")
    if result.maybe_delivered and not channel_honours_keys(channel):
        what = {Outcome.TIMED_OUT: "timed out", Outcome.CANCELLED: "stopped mid-call"}.get(
            outcome, "failed without a definite answer"
        )
        reason = reasons.MAYBE_SENT.format(what=what, channel=channel)
        return Verdict(Status.UNKNOWN, attempt_outcome, reason=reason, error=error)
    maybe_sent = result.maybe_delivered or reminder.maybe_sent
    if outcome == Outcome.PERMANENT:
        if maybe_sent:
            # An earlier call (in this envelope or an earlier claim) got no answer: a
            # refusal now does not say the provider lacks the first one.
            reason = reasons.MAYBE_SENT_NOT_RETRIED.format(why=error)
            return Verdict(Status.UNKNOWN, attempt_outcome, reason=reason, error=error)
        return Verdict(Status.FAILED, attempt_outcome, reason=error, error=error)
    if outcome == Outcome.EXPIRED:
        return Verdict(
            Status.PENDING, attempt_outcome, error=error,
            refund_attempt=not result.provider_reached,
            late_reason=reasons.LATE_IN_RETRY.format(error=error), maybe_sent=maybe_sent,
        )  # fmt: skip
    if outcome == Outcome.WITHDRAWN:
        return Verdict(
            Status.PENDING, attempt_outcome, error=error, refund_attempt=result.attempts == 0,
            late_reason=reasons.MOVED_INSIDE_CUTOFF, maybe_sent=maybe_sent,
        )  # fmt: skip
    if not result.provider_reached and result.attempts == 0:
        # Stopped before the provider was called: hand it back untouched.
        return Verdict(
            Status.PENDING, Attempt.NOT_STARTED, error=error, refund_attempt=True,
            late_reason=reasons.LATE_AT_CLAIM,
        )  # fmt: skip
    if reminder.attempts >= settings.REMINDERS_MAX_ATTEMPTS:
        # Not tried again: the fate says failed (unknown if maybe sent), or cancelled.
        return Verdict(
            Status.PENDING, attempt_outcome, error=error, maybe_sent=maybe_sent,
            gave_up=reasons.GAVE_UP.format(attempts=reminder.attempts, error=error),
        )  # fmt: skip
    return Verdict(
        Status.PENDING, attempt_outcome, error=error,
        retry_at=now + retry_delay(reminder.attempts),
        late_reason=reasons.LATE_IN_RETRY.format(error=error), maybe_sent=maybe_sent,
    )  # fmt: skip


def _fence(claim: Claim) -> Q:
    return Q(claim_token=claim.token, status=Status.SENDING)


def reminder_record_batch(
    *, claim: Claim, results: list[DeliveryResult], clock: Clock | None = None
) -> dict[str, int]:
    """Write the outcome of every claimed reminder, fenced by the claim.

    Guarantee: a reminder row changes only while it is still ``sending``
    under this claim's token, and its DeliveryAttempt changes only when the
    reminder row did (and only while ``in_flight``), so a reaped worker's late
    record touches neither. Locks are taken attendee, workshop, enrollment,
    reminder, attempt, the one order every writer uses. An outcome whose text
    quotes an attendee erased since the claim (a provider echoing the old
    address) is written with that address and name removed. Return counts by
    the new status of the rows actually changed.
    """
    clock = clock or default_clock()
    now = clock.now()
    by_id = {reminder.pk: reminder for reminder in claim.reminders}
    verdicts = {
        result.reminder_id: (
            reminder_verdict(
                result=result, reminder=by_id[result.reminder_id], channel=claim.channel, now=now
            ),
            result,
        )
        for result in results
        if result.reminder_id in by_id
    }
    if not verdicts:
        return {}
    if connection.vendor == "postgresql" and not any(
        verdict.returns or verdict.error or verdict.reason for verdict, _ in verdicts.values()
    ):
        # The common chunk: every outcome final and quoting no one (all sent).
        # Nothing to hand back, so no workshop or enrollment to lock, and no
        # text to scrub, so no attendee: the one statement that locks the rows
        # in id order, writes them and closes their attempts is the whole
        # record, atomic by itself, without BEGIN and COMMIT around it.
        finals = {pk: verdict for pk, (verdict, _) in verdicts.items()}
        changed, _ = _record_finals(claim=claim, finals=finals, verdicts=verdicts, now=now)
        return dict(Counter(str(status) for status in changed.values()))
    with transaction.atomic():
        if any(verdict.returns for verdict, _ in verdicts.values()):
            # Handing rows back decides times (the retry, lateness): by the
            # database's clock, as the claim that takes them again judges them.
            now = database_now(clock)
            verdicts = {
                pk: (
                    reminder_verdict(
                        result=result, reminder=by_id[pk], channel=claim.channel, now=now
                    ),
                    result,
                )
                for pk, (_, result) in verdicts.items()
            }
        verdicts = _without_erased_data(verdicts, by_id)
        finals = {pk: verdict for pk, (verdict, _) in verdicts.items() if not verdict.returns}
        returns = {pk: verdict for pk, (verdict, _) in verdicts.items() if verdict.returns}
        sources = sources_locked(returns)
        claimed_locked(verdicts, claim.token)
        changed, closed = _record_finals(claim=claim, finals=finals, verdicts=verdicts, now=now)
        if returns:
            policy = ReminderPolicy.from_settings()
            fates = {
                pk: reminder_fate(
                    source=sources[pk],
                    policy=policy,
                    now=now,
                    late_reason=verdict.late_reason,
                    retry_at=verdict.retry_at,
                    maybe_sent=verdict.maybe_sent,
                    gave_up=verdict.gave_up,
                )
                for pk, verdict in returns.items()
                if pk in sources
            }
            changed.update(
                reminders_return(
                    fates=fates,
                    guard=_fence(claim),
                    now=now,
                    errors={pk: verdict.error for pk, verdict in returns.items()},
                    refund=[pk for pk, verdict in returns.items() if verdict.refund_attempt],
                )
            )
        _finish_attempts(
            claim=claim,
            verdicts=verdicts,
            changed={pk: status for pk, status in changed.items() if pk not in closed},
            now=now,
        )
    return dict(Counter(str(status) for status in changed.values()))


def _without_erased_data(verdicts: dict, by_id: dict[int, Reminder]) -> dict:
    """Scrub the texts of verdicts whose attendee was erased while the reminder was claimed.

    Only verdicts carrying text need the check (a plain ``sent`` carries
    none), so a record without errors sends no extra statement. The late
    reason needs no scrub: the erasure cancelled the enrollment, so a
    returning reminder of an erased attendee ends ``cancelled``, never
    ``missed`` with that reason.
    """
    quoting = [pk for pk, (v, _) in verdicts.items() if v.error or v.reason]
    erased = erased_among(by_id[pk].attendee_id for pk in quoting)
    if not erased:
        return verdicts
    scrubbed = dict(verdicts)
    for pk in quoting:
        attendee = by_id[pk].attendee
        if attendee.pk not in erased:
            continue
        scrub = scrubber(personal_words(email=attendee.email, name=attendee.name))
        verdict, result = verdicts[pk]
        verdict = replace(verdict, error=scrub(verdict.error), reason=scrub(verdict.reason))
        scrubbed[pk] = (verdict, result)
    return scrubbed


# The columns of the rows the record writes from, with their PostgreSQL types.
_FINAL_COLUMNS = {
    "id": "bigint",
    "status": "text",
    "reason": "text",
    "error": "text",
    "message_id": "text",
}
# What the PostgreSQL record adds to each final row to close its attempt in the same statement.
_FINAL_ATTEMPT_COLUMNS = {
    "outcome": "text",
    "calls": "integer",
}
_ATTEMPT_COLUMNS = {
    "reminder_id": "bigint",
    "outcome": "text",
    "error": "text",
    "message_id": "text",
    "calls": "integer",
}


def _record_finals(
    *, claim: Claim, finals: dict[int, Verdict], verdicts: dict, now: datetime
) -> tuple[dict[int, str], set[int]]:
    """Write the final verdicts in one fenced ``UPDATE ... FROM`` a table of rows.

    One row of values per reminder (``_sql.rows_cte``: arrays on PostgreSQL),
    so the statement's cost grows with the chunk, not with chunk x columns as
    a CASE per column would (the ORM's CASE expressions took most of the
    record's CPU). Return ``({id: new status}, ids whose attempt is closed
    too)``: on PostgreSQL the same statement first locks the rows it may
    change, ``FOR UPDATE`` in id order as ``fate.claimed_locked`` does (a
    no-op where the caller holds them already; alone, it keeps every
    writer's lock order), and closes the attempts of the rows it changed (a
    second UPDATE in the WITH, fed by the first one's RETURNING, run after
    it), so a chunk whose outcomes are all final costs one statement.
    SQLite cannot update in a WITH: ``_finish_attempts`` closes them.
    """
    if not finals:
        return {}, set()
    postgres = connection.vendor == "postgresql"
    rows = []
    for pk, v in finals.items():
        row = (pk, v.status, v.reason[:200], v.error, v.message_id[:255])
        if postgres:
            row += (v.attempt_outcome, verdicts[pk][1].attempts)
        rows.append(row)
    columns = _FINAL_COLUMNS | (_FINAL_ATTEMPT_COLUMNS if postgres else {})
    values, params = rows_cte(connection, "v", columns, rows)
    reminder = _table(Reminder)
    stamp = connection.ops.adapt_datetimefield_value(now)
    token = claim_token_param(claim.token)
    fence = f"{reminder}.claim_token = %s AND {reminder}.status = %s"
    fence_params = [token, Status.SENDING.value]
    source = "v"
    if postgres:
        # Every row the UPDATE writes comes to it through ``locked``: the
        # reminders are locked in id order, and the UPDATE never waits for a
        # row it does not hold already.
        lock, lock_params = lock_in_id_order(finals, where=fence, params=fence_params)
        values += f", locked AS MATERIALIZED ({lock})"
        params += lock_params
        source = "v JOIN locked ON locked.id = v.id"
    update = (
        f"UPDATE {reminder} SET status = v.status, status_reason = v.reason, "
        "last_error = v.error, provider_message_id = v.message_id, "
        "sent_at = CASE WHEN v.status = %s THEN %s ELSE NULL END, next_attempt_at = NULL, "
        f"maybe_sent = ({reminder}.maybe_sent OR v.status = %s), "
        "claim_token = NULL, lease_expires_at = NULL, updated_at = %s "
        f"FROM {source} WHERE {reminder}.id = v.id AND {fence} "
        f"RETURNING {reminder}.id, {reminder}.status"
    )
    params += [Status.SENT.value, stamp, Status.UNKNOWN.value, stamp, *fence_params]
    if postgres:
        # A data-modifying WITH that the main query does not read runs after
        # it: the attempts are locked after every reminder, as in every writer.
        attempt = _table(DeliveryAttempt)
        sql = (
            f"WITH {values}, done AS ({update}), "
            f"closed AS (UPDATE {attempt} SET outcome = v.outcome, error = v.error, "
            "provider_message_id = v.message_id, provider_calls = v.calls, finished_at = %s "
            f"FROM v JOIN done ON done.id = v.id WHERE {attempt}.reminder_id = v.id "
            f"AND {attempt}.claim_token = %s AND {attempt}.outcome = %s) "
            "SELECT id, status FROM done"
        )
        params += [stamp, token, Attempt.IN_FLIGHT.value]
    else:
        sql = f"WITH {values} {update}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        changed = {pk: status for pk, status in cursor.fetchall()}
    return changed, set(changed) if postgres else set()


def _finish_attempts(
    *, claim: Claim, verdicts: dict, changed: dict[int, str], now: datetime
) -> None:
    """Close the in-flight attempts of the reminders whose row the record changed (one UPDATE)."""
    if not changed:
        return
    rows = []
    for pk in changed:
        verdict, result = verdicts[pk]
        rows.append(
            (pk, verdict.attempt_outcome, verdict.error, (verdict.message_id or "")[:255],
             result.attempts)
        )  # fmt: skip
    values, params = rows_cte(connection, "v", _ATTEMPT_COLUMNS, rows)
    attempt = _table(DeliveryAttempt)
    sql = (
        f"WITH {values} "
        f"UPDATE {attempt} SET outcome = v.outcome, error = v.error, "
        "provider_message_id = v.message_id, provider_calls = v.calls, finished_at = %s "
        f"FROM v WHERE {attempt}.reminder_id = v.reminder_id AND {attempt}.claim_token = %s "
        f"AND {attempt}.outcome = %s"
    )
    params += [
        connection.ops.adapt_datetimefield_value(now),
        claim_token_param(claim.token),
        Attempt.IN_FLIGHT.value,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def reminder_release(
    *,
    claim: Claim,
    ids: list[int] | None = None,
    clock: Clock | None = None,
    whoever_holds: bool = False,
) -> int:
    """Hand claimed reminders whose provider call never started back, re-deriving their fate.

    Used when a batch stops before the engine ran (a crash while building
    envelopes, a stop signal between chunks). The attempt is refunded: no
    provider was called, so it must not count towards the attempt cap.
    Fenced like the record; return how many rows changed. With
    ``whoever_holds`` the rows are locked whatever their claim, which waits
    for a transaction still holding them (``reminder_release_interrupted``).
    """
    clock = clock or default_clock()
    now = database_now(clock)  # the fate's lateness, by the database's clock
    ids = claim.ids if ids is None else ids
    policy = ReminderPolicy.from_settings()
    with transaction.atomic():
        fates = {
            pk: reminder_fate(
                source=source, policy=policy, now=now, late_reason=reasons.LATE_AT_CLAIM
            )
            for pk, source in sources_locked(ids).items()
        }
        if whoever_holds:
            reminders_locked(fates, Q())
        else:
            claimed_locked(fates, claim.token)
        changed = reminders_return(fates=fates, guard=_fence(claim), now=now, refund=fates)
        if changed:
            DeliveryAttempt.objects.filter(
                claim_token=claim.token, reminder_id__in=list(changed), outcome=Attempt.IN_FLIGHT
            ).update(outcome=Attempt.NOT_STARTED, finished_at=now)
    return len(changed)


def reminder_release_interrupted(
    *, token, channel: str, ids: list[int], clock: Clock | None = None
) -> int:
    """Release what a claim of ``ids`` interrupted before it returned holds under ``token``.

    Its statement (or, on SQLite, its COMMIT) may have gone out before the
    interruption: the server then commits it, perhaps only after the caller
    dropped that connection and opened another. So the rows are locked
    whoever holds them, in id order after their workshops and enrollments
    (the order every writer uses), which queues behind that statement and
    waits for it to end; the release then reads them as it left them.
    Return how many rows were handed back.
    """
    clock = clock or default_clock()
    claim = Claim(token=token, lease_expires_at=clock.now(), channel=channel, reminders=[])
    return reminder_release(claim=claim, ids=ids, clock=clock, whoever_holds=True)
