"""What a worker writes after its provider calls: the record of each outcome, or a release.

Both are fenced by the claim's token, held only while ``sending``: a reaped worker changes nothing.
``sent``, ``failed`` and ``unknown`` are written as they are; any other outcome hands the
reminder back to a fate re-derived from its workshop and enrollment (reminders.services.fate).
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


def channel_honours_keys(channel: str) -> bool:
    """Whether the provider deduplicates by the reminder's key: an unknown send may be repeated
    with that key."""
    return channel in ("http", "file")


def maybe_sent_reason(outcome: str, channel: str) -> str:
    """Why a call that may have reached a provider without keys ends ``unknown``."""
    what = {Outcome.TIMED_OUT: "timed out", Outcome.CANCELLED: "stopped mid-call"}.get(
        outcome, "failed without a definite answer"
    )
    return reasons.MAYBE_SENT.format(what=what, channel=channel)


def retry_delay(attempts: int) -> timedelta:
    """Return how long a reminder waits before its next claim after ``attempts`` claims."""
    base = settings.REMINDERS_RETRY_BASE
    return timedelta(seconds=min(settings.REMINDERS_RETRY_MAX, base * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one delivery result means for its reminder's row.

    ``status`` is final or ``pending`` ("hand it back"): the fate then picks ``pending``,
    ``missed`` (``late_reason``) or ``failed`` at the attempt cap (``gave_up``), each
    ``unknown`` if ``maybe_sent``, or ``cancelled``, which wins over both.
    """

    status: str
    attempt_outcome: str
    reason: str = ""
    error: str = ""
    message_id: str = ""
    retry_at: datetime | None = None
    refund_attempt: bool = False
    late_reason: str = ""
    #: A call may have reached the provider: a keyed retry is safe, but a reminder not tried
    #: again is ``unknown``, not ``missed``.
    maybe_sent: bool = False
    #: Why the attempt cap was reached: ``failed`` (``unknown`` if maybe sent) unless cancelled.
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

    A call that may have reached a provider without keys is ``unknown`` whatever it says:
    ``failed`` would invite a replay that sends it twice. With keys it is retried with the same
    key; the row's ``maybe_sent`` makes a refusal, or a fate that cannot retry, ``unknown``.
    """
    outcome = result.outcome
    error = redact_text(result.error)  # whatever the channel quoted, no secret is stored
    attempt_outcome = _ATTEMPT_OUTCOMES[outcome]
    if outcome == Outcome.SENT:
        return Verdict(Status.SENT, attempt_outcome, message_id=result.message_id or "")
    if result.maybe_delivered and not channel_honours_keys(channel):
        reason = maybe_sent_reason(outcome, channel)
        return Verdict(Status.UNKNOWN, attempt_outcome, reason=reason, error=error)
    maybe_sent = result.maybe_delivered or reminder.maybe_sent
    if outcome == Outcome.PERMANENT:
        if maybe_sent:
            # An earlier call got no answer: a refusal now does not say the provider lacks it.
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
    return Q(claim_token=claim.token)  # held only while sending (reminder_claimed_while_sending)


def reminder_record_batch(
    *, claim: Claim, results: list[DeliveryResult], clock: Clock | None = None
) -> dict[str, int]:
    """Write the outcome of every claimed reminder, fenced by the claim; return counts by status.

    A reaped worker's late record changes neither row nor attempt. Locks are taken attendee,
    workshop, enrollment, reminder, attempt, as every writer does. Text quoting an attendee
    erased since the claim is scrubbed.
    """
    clock = clock or default_clock()
    now = clock.now()
    by_id = {reminder.pk: reminder for reminder in claim.reminders}

    def judged(now: datetime) -> dict[int, tuple[Verdict, DeliveryResult]]:
        return {
            result.reminder_id: (
                reminder_verdict(
                    result=result,
                    reminder=by_id[result.reminder_id],
                    channel=claim.channel,
                    now=now,
                ),
                result,
            )
            for result in results
            if result.reminder_id in by_id
        }

    verdicts = judged(now)
    if not verdicts:
        return {}
    if connection.vendor == "postgresql" and not any(
        verdict.returns or verdict.error or verdict.reason for verdict, _ in verdicts.values()
    ):
        # The common chunk (all sent, quoting no one): nothing else to lock, so one statement,
        # atomic alone, locks the rows in id order, writes them and closes their attempts.
        changed, _ = _record_finals(claim=claim, verdicts=verdicts, now=now)
        return dict(Counter(str(status) for status in changed.values()))
    with transaction.atomic():
        if any(verdict.returns for verdict, _ in verdicts.values()):
            # Handing back decides times by the database's clock, as the next claim judges.
            now = database_now(clock)
            verdicts = judged(now)
        verdicts = _without_erased_data(verdicts, by_id)
        returns = {pk: verdict for pk, (verdict, _) in verdicts.items() if verdict.returns}
        sources = sources_locked(returns)
        claimed_locked(verdicts, claim.token)
        changed, closed = _record_finals(claim=claim, verdicts=verdicts, now=now)
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
            claim=claim, verdicts=verdicts, ids=[pk for pk in changed if pk not in closed], now=now
        )
    return dict(Counter(str(status) for status in changed.values()))


def _without_erased_data(verdicts: dict, by_id: dict[int, Reminder]) -> dict:
    """Scrub the texts of verdicts whose attendee was erased while the reminder was claimed.

    Only verdicts carrying text are checked, so a record without errors costs no statement. The
    late reason needs none: erasure cancelled the enrollment.
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
_FINAL_ATTEMPT_COLUMNS = {"outcome": "text", "calls": "integer"}
_ATTEMPT_COLUMNS = {
    "id": "bigint",
    "outcome": "text",
    "error": "text",
    "message_id": "text",
    "calls": "integer",
}


def _record_finals(
    *, claim: Claim, verdicts: dict, now: datetime
) -> tuple[dict[int, str], set[int]]:
    """Write the final verdicts in one fenced ``UPDATE ... FROM``.

    Return ``({id: new status}, ids whose attempt is closed too)``: on PostgreSQL the statement
    also locks the rows in id order and closes their attempts; SQLite cannot update in a WITH.
    """
    finals = {pk: verdict for pk, (verdict, _) in verdicts.items() if not verdict.returns}
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
    fence = f"{reminder}.claim_token = %s"
    fence_params = [token]
    source = "v"
    if postgres:
        # The UPDATE writes only rows ``locked`` took in id order, so never waits on another.
        lock, lock_params = lock_in_id_order(finals, where=fence, params=fence_params)
        values += f", locked AS MATERIALIZED ({lock})"
        params += lock_params
        source = "v JOIN locked ON locked.id = v.id"
        # ``locked`` checked the fence under row locks held to the statement's end. Checked
        # again here, a token the statistics take for rare made the planner scan for it first.
        fence, fence_params = "TRUE", []
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
        # An unread data-modifying WITH runs last: attempts lock after reminders, as everywhere.
        sql = (
            f"WITH {values}, done AS ({update}), "
            f"closed AS ({_attempts_closed('v JOIN done ON done.id = v.id')}) "
            "SELECT id, status FROM done"
        )
        params += [stamp, token, Attempt.IN_FLIGHT.value]
    else:
        sql = f"WITH {values} {update}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        changed = {pk: status for pk, status in cursor.fetchall()}
    return changed, set(changed) if postgres else set()


def _finish_attempts(*, claim: Claim, verdicts: dict, ids: list[int], now: datetime) -> None:
    """Close the in-flight attempts of the reminders ``ids`` (one UPDATE)."""
    if not ids:
        return
    rows = []
    for pk in ids:
        verdict, result = verdicts[pk]
        rows.append(
            (pk, verdict.attempt_outcome, verdict.error, verdict.message_id[:255], result.attempts)
        )
    values, params = rows_cte(connection, "v", _ATTEMPT_COLUMNS, rows)
    params += [
        connection.ops.adapt_datetimefield_value(now),
        claim_token_param(claim.token),
        Attempt.IN_FLIGHT.value,
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {values} {_attempts_closed('v')}", params)


def _attempts_closed(source: str) -> str:
    """Return the UPDATE closing the in-flight attempts of the rows ``v`` of ``source``.

    ``v`` has the columns of ``_ATTEMPT_COLUMNS``; the parameters are the time they finished,
    the claim token and the in-flight outcome.
    """
    attempt = _table(DeliveryAttempt)
    return (
        f"UPDATE {attempt} SET outcome = v.outcome, error = v.error, "
        "provider_message_id = v.message_id, provider_calls = v.calls, finished_at = %s "
        f"FROM {source} WHERE {attempt}.reminder_id = v.id "
        f"AND {attempt}.claim_token = %s AND {attempt}.outcome = %s"
    )


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def reminder_release(
    *,
    claim: Claim,
    ids: list[int] | None = None,
    clock: Clock | None = None,
    whoever_holds: bool = False,
) -> int:
    """Hand back claimed reminders whose provider call never started; return how many.

    The fate is re-derived and the attempt refunded. Fenced like the record; ``whoever_holds``
    locks the rows whatever their claim, waiting for a transaction still holding them.
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

    Its statement may commit after the caller reconnected: locking the rows whoever holds them
    waits for it. Return how many were released.
    """
    claim = Claim(token=token, channel=channel, reminders=[])
    return reminder_release(claim=claim, ids=ids, clock=clock, whoever_holds=True)
