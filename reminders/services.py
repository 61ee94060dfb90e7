"""Writes to reminders: every status change in the project happens here.

Each status change is one guarded, set-based UPDATE whose ``WHERE`` names the
statuses it may leave (``status IN (...)``); the row count says which caller
won, so two processes racing on the same reminder cannot both succeed. No code
outside this module assigns ``Reminder.status``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    Case,
    CharField,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast, Concat, Least, Left

from clock import Clock, default_clock
from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from workshops.models import Enrollment, Workshop

logger = logging.getLogger(__name__)

Status = Reminder.Status

REASON_ENROLLED_LATE = "enrolled after cutoff"
REASON_PLANNED_LATE = "deadline passed before the reminder was planned (was the scan running?)"
REASON_WORKSHOP_CANCELLED = "workshop cancelled"
REASON_ENROLLMENT_CANCELLED = "enrollment cancelled"
REASON_MOVED_INSIDE_CUTOFF = "workshop moved inside the cutoff"

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
    late = {"workshop__starts_at__lte": now + policy.cutoff}
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
            p_status=Case(When(**late, then=Value(Status.MISSED)), default=Value(Status.PENDING)),
            p_reason=Case(When(**late, then=Value(late_reason)), default=Value("")),
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
    late_reason: str = REASON_PLANNED_LATE,
) -> int:
    """Create the missing reminders for enrollments whose workshop starts within the lead.

    One ``INSERT ... SELECT ... ON CONFLICT DO NOTHING`` statement, whatever the
    number of workshops: the unique constraint on (attendee, workshop) decides
    between concurrent scans, so two overlapping plans create each row once.
    Reminders whose deadline has already passed are created as ``missed``
    with ``late_reason``, never as sendable. Return how many rows were created.
    """
    clock = clock or default_clock()
    policy = policy or ReminderPolicy.from_settings()
    source = _plan_source(
        now=clock.now(),
        policy=policy,
        enrollments=Enrollment.objects.all() if enrollments is None else enrollments,
        late_reason=late_reason,
    )
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

    Runs inside the workshop service's transaction (workshops.signals), so the
    workshop row is locked or freshly written and a concurrent claim either
    committed before (and is fenced by its own guard) or sees the new values.
    """
    clock = clock or default_clock()
    open_reminders = Reminder.objects.filter(workshop=workshop, status__in=Reminder.OPEN_STATUSES)
    if workshop.status == Workshop.Status.CANCELLED:
        open_reminders.update(
            status=Status.CANCELLED,
            status_reason=REASON_WORKSHOP_CANCELLED,
            queued_until=None,
            next_attempt_at=None,
            updated_at=clock.now(),
        )
        return
    if "starts_at" in changed:
        _reschedule(workshop=workshop, reminders=open_reminders, clock=clock)
    if changed & {"starts_at", "created"}:
        reminders_plan(clock=clock, enrollments=Enrollment.objects.filter(workshop=workshop))


def _reschedule(*, workshop: Workshop, reminders: QuerySet[Reminder], clock: Clock) -> None:
    policy = ReminderPolicy.from_settings()
    now = clock.now()
    deadline = policy.deadline_at(workshop.starts_at)
    window = policy.window_opens_at(workshop.starts_at)
    if deadline <= now:
        reminders.update(
            status=Status.MISSED,
            status_reason=REASON_MOVED_INSIDE_CUTOFF,
            window_opens_at=window,
            deadline_at=deadline,
            queued_until=None,
            next_attempt_at=None,
            updated_at=now,
        )
    else:
        reminders.update(window_opens_at=window, deadline_at=deadline, updated_at=now)


def reminders_follow_enrollment(*, enrollment: Enrollment, clock: Clock | None = None) -> None:
    """Cancel or (re)plan the reminder of one enrollment, inside its transaction."""
    clock = clock or default_clock()
    now = clock.now()
    if enrollment.status == Enrollment.Status.CANCELLED:
        Reminder.objects.filter(enrollment=enrollment, status__in=Reminder.OPEN_STATUSES).update(
            status=Status.CANCELLED,
            status_reason=REASON_ENROLLMENT_CANCELLED,
            queued_until=None,
            next_attempt_at=None,
            updated_at=now,
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
        status_reason=REASON_ENROLLMENT_CANCELLED,
    )
    if deadline > now:
        revived.update(
            status=Status.PENDING,
            status_reason="",
            window_opens_at=policy.window_opens_at(workshop.starts_at),
            deadline_at=deadline,
            updated_at=now,
        )
    else:
        revived.update(status=Status.MISSED, status_reason=REASON_ENROLLED_LATE, updated_at=now)
    reminders_plan(
        clock=clock,
        enrollments=Enrollment.objects.filter(pk=enrollment.pk),
        late_reason=REASON_ENROLLED_LATE,
    )


# --- The send pipeline: expire, reap, dispatch, claim, record, release ----------

REASON_LATE_AT_CLAIM = "deadline passed before a worker could send it"
REASON_LATE_IN_QUEUE = "deadline passed while queued (were the workers running?)"
REASON_LATE_IN_RETRY = "deadline passed while retrying: {error}"
REASON_GAVE_UP = "gave up after {attempts} attempts: {error}"
REASON_MAYBE_SENT = (
    "{what}; the provider may have accepted it (channel {channel} has no idempotency key)"
)
REASON_LEASE_LOST = "worker lost during the send (lease expired)"

# Channels whose provider deduplicates by the reminder's key: a send whose
# outcome is unknown may be repeated with the same key without a duplicate.
CHANNELS_HONOURING_KEYS = frozenset({"http", "file"})


def channel_honours_keys(channel: str) -> bool:
    return channel in CHANNELS_HONOURING_KEYS


def retry_delay(attempts: int) -> timedelta:
    """Return how long a reminder waits before its next claim after ``attempts`` claims."""
    base = settings.REMINDERS_RETRY_BASE
    return timedelta(seconds=min(settings.REMINDERS_RETRY_MAX, base * 2 ** max(0, attempts - 1)))


def _scheduled_workshops() -> QuerySet:
    return Workshop.objects.filter(status=Workshop.Status.SCHEDULED).values("id")


def _active_enrollments() -> QuerySet:
    return Enrollment.objects.filter(status=Enrollment.Status.ACTIVE).values("id")


def reminders_expire(*, clock: Clock | None = None) -> int:
    """Mark open reminders whose deadline has passed as ``missed``; return how many.

    Work that sat in a queue past its deadline (workers down, messages
    expired in the broker) would otherwise stay ``queued`` forever. The rule
    is the policy's ``late_q``, the same one the claim enforces.
    """
    clock = clock or default_clock()
    now = clock.now()
    return Reminder.objects.filter(
        ReminderPolicy.late_q(now), status__in=Reminder.OPEN_STATUSES
    ).update(
        status=Status.MISSED,
        status_reason=Case(
            When(
                last_error__gt="",
                then=Left(
                    Concat(
                        Value("deadline passed while retrying: "),
                        "last_error",
                        output_field=TextField(),
                    ),
                    200,
                ),
            ),
            When(status=Status.QUEUED, then=Value(REASON_LATE_IN_QUEUE)),
            default=Value(REASON_LATE_AT_CLAIM),
            output_field=TextField(),
        ),
        queued_until=None,
        next_attempt_at=None,
        updated_at=now,
    )


def reminders_reap(*, clock: Clock | None = None) -> dict[str, int]:
    """Resolve reminders whose claim lease expired: the worker holding them is gone.

    A channel that honours idempotency keys gets the reminder back in the
    queue with the same key (the provider drops a duplicate); any other
    channel gets ``unknown``, for staff to decide, because the message may
    have reached the provider. Never silently re-sent, never silently dropped.
    The lease is longer than Celery's hard time limit, so a live worker never
    loses a claim it still holds.
    """
    clock = clock or default_clock()
    now = clock.now()
    expired = Reminder.objects.filter(status=Status.SENDING, lease_expires_at__lte=now)
    counts = {"requeued": 0, "unknown": 0, "failed": 0}
    with transaction.atomic():
        DeliveryAttempt.objects.filter(
            outcome=DeliveryAttempt.Outcome.IN_FLIGHT,
            claim_token__in=expired.values("claim_token"),
        ).update(
            outcome=DeliveryAttempt.Outcome.LEASE_EXPIRED, finished_at=now, error=REASON_LEASE_LOST
        )
        idempotent = expired.filter(channel__in=CHANNELS_HONOURING_KEYS)
        counts["failed"] = idempotent.filter(attempts__gte=settings.REMINDERS_MAX_ATTEMPTS).update(
            status=Status.FAILED,
            status_reason=REASON_GAVE_UP.format(
                attempts=settings.REMINDERS_MAX_ATTEMPTS, error=REASON_LEASE_LOST
            ),
            last_error=REASON_LEASE_LOST,
            claim_token=None,
            lease_expires_at=None,
            updated_at=now,
        )
        counts["requeued"] = idempotent.filter(ReminderPolicy.on_time_q(now)).update(
            status=Status.PENDING,
            last_error=REASON_LEASE_LOST,
            next_attempt_at=None,
            claim_token=None,
            lease_expires_at=None,
            updated_at=now,
        )
        counts["unknown"] = expired.update(
            status=Status.UNKNOWN,
            status_reason=REASON_LEASE_LOST,
            last_error=REASON_LEASE_LOST,
            claim_token=None,
            lease_expires_at=None,
            updated_at=now,
        )
    if any(counts.values()):
        logger.warning("Reaped expired leases: %s", counts)
    return counts


def reminders_dispatch(
    *,
    clock: Clock | None = None,
    batch_size: int | None = None,
    limit: int | None = None,
    publish: Callable[[list[int], datetime], None] | None = None,
    ids: list[int] | None = None,
) -> int:
    """Queue due reminders and publish them by id in batches, after commit.

    Due: window open, deadline not passed, retry time reached, and either
    never queued or queued under a message that has since expired (lost in a
    broker restart, dropped unpublished): this is the reconciler. A reminder
    whose message is still live is left alone, so a slow queue is not flooded.
    Each message expires at ``queued_until``, no later than the earliest
    deadline in its batch, so a message and its row agree on when it is stale.
    ``ids`` restricts the dispatch to those reminders (replay uses it); the
    same due rule applies. Return how many reminders were queued.
    """
    from reminders.publish import publish_batch

    clock = clock or default_clock()
    now = clock.now()
    batch_size = batch_size or settings.REMINDERS_BATCH_SIZE
    limit = limit or settings.REMINDERS_DISPATCH_LIMIT
    publish = publish or publish_batch
    requeue_after = timedelta(seconds=settings.REMINDERS_REQUEUE_AFTER)
    due = (
        Reminder.objects.filter(
            ReminderPolicy.on_time_q(now),
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            Q(status=Status.PENDING) | Q(status=Status.QUEUED, queued_until__lte=now),
            window_opens_at__lte=now,
        )
        .order_by("deadline_at", "id")
        .values_list("id", flat=True)
    )
    if ids is not None:
        due = due.filter(id__in=ids)
    with transaction.atomic():
        ids = list(due.select_for_update(skip_locked=True)[:limit])
        if not ids:
            return 0
        queued_until = Least(F("deadline_at"), Value(now + requeue_after))
        Reminder.objects.filter(
            Q(status=Status.PENDING) | Q(status=Status.QUEUED, queued_until__lte=now), id__in=ids
        ).update(status=Status.QUEUED, queued_until=queued_until, updated_at=now)
        rows = list(
            Reminder.objects.filter(id__in=ids, status=Status.QUEUED)
            .order_by("deadline_at", "id")
            .values_list("id", "queued_until")
        )
        batches = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        for batch in batches:
            batch_ids = [reminder_id for reminder_id, _ in batch]
            expires_at = min(until for _, until in batch)
            transaction.on_commit(partial(publish, batch_ids, expires_at))
    logger.info("Dispatched %s reminders in %s batches", len(rows), len(batches))
    return len(rows)


def reminders_unpublished(*, ids: list[int], clock: Clock | None = None) -> int:
    """Make queued reminders whose message failed to publish due again at the next scan."""
    clock = clock or default_clock()
    return Reminder.objects.filter(id__in=ids, status=Status.QUEUED).update(
        queued_until=clock.now()
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """What one worker now owns: reminders fenced by ``token`` until ``lease_expires_at``."""

    token: uuid.UUID
    lease_expires_at: datetime
    channel: str
    reminders: list[Reminder]

    @property
    def ids(self) -> list[int]:
        return [reminder.pk for reminder in self.reminders]


def reminder_claim_batch(
    *,
    ids: list[int],
    channel: str,
    worker: str = "",
    lease_seconds: int | None = None,
    clock: Clock | None = None,
) -> Claim:
    """Make the calling worker the single owner of those of ``ids`` that may be sent now.

    One guarded UPDATE (status, deadline, window and retry time in its WHERE)
    takes the rows: under PostgreSQL's READ COMMITTED, a concurrent claimer
    blocks on the row lock, then re-evaluates the WHERE against the committed
    row, sees ``status = 'sending'`` and changes nothing. Exactly one claimer
    wins each row. This is also the one place the deadline is *enforced*:
    ids refused for lateness become ``missed`` here. The claim, its lease and
    a DeliveryAttempt per reminder commit before any provider is called.
    """
    clock = clock or default_clock()
    now = clock.now()
    lease = now + timedelta(seconds=lease_seconds or settings.REMINDERS_LEASE_SECONDS)
    token = uuid.uuid4()
    with transaction.atomic():
        Reminder.objects.filter(
            ReminderPolicy.on_time_q(now),
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            id__in=ids,
            status__in=Reminder.OPEN_STATUSES,
            window_opens_at__lte=now,
            workshop_id__in=_scheduled_workshops(),
            enrollment_id__in=_active_enrollments(),
        ).update(
            status=Status.SENDING,
            claim_token=token,
            lease_expires_at=lease,
            attempts=F("attempts") + 1,
            channel=channel,
            queued_until=None,
            next_attempt_at=None,
            updated_at=now,
        )
        Reminder.objects.filter(
            ReminderPolicy.late_q(now), id__in=ids, status__in=Reminder.OPEN_STATUSES
        ).update(
            status=Status.MISSED,
            status_reason=REASON_LATE_AT_CLAIM,
            queued_until=None,
            next_attempt_at=None,
            updated_at=now,
        )
        claimed = list(
            Reminder.objects.filter(claim_token=token, status=Status.SENDING)
            .select_related("attendee", "workshop")
            .order_by("deadline_at", "id")
        )
        _record_attempts(token=token, worker=worker)
    return Claim(token=token, lease_expires_at=lease, channel=channel, reminders=claimed)


def _record_attempts(*, token: uuid.UUID, worker: str) -> None:
    """Insert one in-flight DeliveryAttempt per reminder of the claim, in one statement.

    Each attempt is numbered after the reminder's highest earlier one, not by
    ``Reminder.attempts``: that counter goes down when a claim is refunded
    (released before any provider call, or replayed by staff), and the
    history must stay append-only and uniquely numbered.
    """
    attempt = connection.ops.quote_name(DeliveryAttempt._meta.db_table)
    reminder = connection.ops.quote_name(Reminder._meta.db_table)
    token_value = Reminder._meta.get_field("claim_token").get_db_prep_value(token, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {attempt} (reminder_id, number, claim_token, channel, worker, "
            "claimed_at, lease_expires_at, finished_at, outcome, provider_calls, error, "
            "provider_message_id) "
            f"SELECT r.id, COALESCE((SELECT MAX(a.number) FROM {attempt} a "
            "WHERE a.reminder_id = r.id), 0) + 1, r.claim_token, r.channel, %s, "
            "r.updated_at, r.lease_expires_at, NULL, %s, 0, '', '' "
            f"FROM {reminder} r WHERE r.claim_token = %s AND r.status = %s",
            [
                worker[:200],
                DeliveryAttempt.Outcome.IN_FLIGHT.value,
                token_value,
                Status.SENDING.value,
            ],
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one delivery result means for its reminder's row."""

    status: str
    attempt_outcome: str
    reason: str = ""
    error: str = ""
    message_id: str = ""
    next_attempt_at: datetime | None = None
    refund_attempt: bool = False


def reminder_verdict(
    *, result: DeliveryResult, reminder: Reminder, channel: str, now: datetime
) -> Verdict:
    """Decide the new status of a claimed reminder from its delivery result (pure)."""
    outcome = result.outcome
    error = result.error
    attempt_outcome = _ATTEMPT_OUTCOMES[outcome]
    if outcome == Outcome.SENT:
        return Verdict(Status.SENT, attempt_outcome, message_id=result.message_id or "")
    if outcome == Outcome.PERMANENT:
        return Verdict(Status.FAILED, attempt_outcome, reason=error, error=error)
    if outcome == Outcome.EXPIRED:
        return Verdict(
            Status.MISSED, attempt_outcome, reason=REASON_LATE_IN_RETRY.format(error=error),
            error=error, refund_attempt=not result.provider_reached,
        )  # fmt: skip
    if not result.provider_reached and result.attempts == 0:
        # Stopped before the provider was called: hand it back untouched.
        return Verdict(
            Status.PENDING, DeliveryAttempt.Outcome.NOT_STARTED, error=error, refund_attempt=True
        )
    if result.maybe_delivered and not channel_honours_keys(channel):
        what = {Outcome.TIMED_OUT: "timed out", Outcome.CANCELLED: "stopped mid-call"}.get(
            outcome, "failed without a definite answer"
        )
        reason = REASON_MAYBE_SENT.format(what=what, channel=channel)
        return Verdict(Status.UNKNOWN, attempt_outcome, reason=reason, error=error)
    if reminder.attempts >= settings.REMINDERS_MAX_ATTEMPTS:
        reason = REASON_GAVE_UP.format(attempts=reminder.attempts, error=error)
        return Verdict(Status.FAILED, attempt_outcome, reason=reason, error=error)
    retry_at = now + retry_delay(reminder.attempts)
    if ReminderPolicy.is_late(deadline_at=reminder.deadline_at, now=retry_at):
        reason = REASON_LATE_IN_RETRY.format(error=error)
        return Verdict(Status.MISSED, attempt_outcome, reason=reason, error=error)
    return Verdict(Status.PENDING, attempt_outcome, error=error, next_attempt_at=retry_at)


_ATTEMPT_OUTCOMES = {
    Outcome.SENT: DeliveryAttempt.Outcome.SENT,
    Outcome.TRANSIENT: DeliveryAttempt.Outcome.TRANSIENT,
    Outcome.PERMANENT: DeliveryAttempt.Outcome.PERMANENT,
    Outcome.TIMED_OUT: DeliveryAttempt.Outcome.TIMED_OUT,
    Outcome.CANCELLED: DeliveryAttempt.Outcome.CANCELLED,
    Outcome.EXPIRED: DeliveryAttempt.Outcome.NOT_STARTED,
}


def reminder_record_batch(
    *, claim: Claim, results: list[DeliveryResult], clock: Clock | None = None
) -> dict[str, int]:
    """Write the outcome of every claimed reminder in two statements, fenced by the claim.

    ``WHERE claim_token = <this claim> AND status = 'sending'``: a worker
    whose lease was reaped (and whose reminder may now belong to a newer
    claim) changes nothing. Return counts by new status.
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

    def case(values: dict[int, object], output_field, default=None):
        # NULL branches are left to ELSE: PostgreSQL would type a bare NULL as
        # text, and the CASE would no longer fit a timestamp column.
        whens = [
            When(pk=pk, then=Value(value, output_field=output_field))
            for pk, value in values.items()
            if value is not None
        ]
        if not whens:
            return default
        return Case(*whens, default=default, output_field=output_field)

    char, text, stamp = CharField(), TextField(), DateTimeField()
    with transaction.atomic():
        Reminder.objects.filter(
            id__in=list(verdicts), claim_token=claim.token, status=Status.SENDING
        ).update(
            status=case({pk: v.status for pk, (v, _) in verdicts.items()}, char),
            status_reason=case({pk: v.reason[:200] for pk, (v, _) in verdicts.items()}, char),
            last_error=case({pk: v.error for pk, (v, _) in verdicts.items()}, text),
            provider_message_id=case(
                {pk: v.message_id[:255] for pk, (v, _) in verdicts.items()}, char
            ),
            next_attempt_at=case({pk: v.next_attempt_at for pk, (v, _) in verdicts.items()}, stamp),
            sent_at=case(
                {pk: now for pk, (v, _) in verdicts.items() if v.status == Status.SENT}, stamp
            ),
            attempts=F("attempts")
            - case(
                {pk: 1 for pk, (v, _) in verdicts.items() if v.refund_attempt},
                IntegerField(),
                default=Value(0),
            ),
            claim_token=None,
            lease_expires_at=None,
            updated_at=now,
        )
        DeliveryAttempt.objects.filter(
            claim_token=claim.token, reminder_id__in=list(verdicts)
        ).update(
            outcome=Case(
                *[
                    When(reminder_id=pk, then=Value(v.attempt_outcome))
                    for pk, (v, _) in verdicts.items()
                ],
                output_field=char,
            ),
            error=Case(
                *[When(reminder_id=pk, then=Value(v.error)) for pk, (v, _) in verdicts.items()],
                output_field=text,
            ),
            provider_message_id=Case(
                *[
                    When(reminder_id=pk, then=Value((v.message_id or "")[:255]))
                    for pk, (v, _) in verdicts.items()
                ],
                output_field=char,
            ),
            provider_calls=Case(
                *[When(reminder_id=pk, then=Value(r.attempts)) for pk, (_, r) in verdicts.items()],
                output_field=IntegerField(),
            ),
            finished_at=now,
        )
    counts: dict[str, int] = {}
    for verdict, _ in verdicts.values():
        status = str(verdict.status)
        counts[status] = counts.get(status, 0) + 1
    return counts


def reminder_release(
    *, claim: Claim, ids: list[int] | None = None, clock: Clock | None = None
) -> int:
    """Hand claimed reminders whose provider call never started back to the queue.

    Used when a batch stops before the engine ran (a crash while building
    envelopes, a stop signal between chunks). The attempt is refunded: no
    provider was called, so it must not count towards the attempt cap.
    """
    clock = clock or default_clock()
    now = clock.now()
    ids = claim.ids if ids is None else ids
    with transaction.atomic():
        released = Reminder.objects.filter(
            id__in=ids, claim_token=claim.token, status=Status.SENDING
        ).update(
            status=Status.PENDING,
            attempts=F("attempts") - 1,
            claim_token=None,
            lease_expires_at=None,
            updated_at=now,
        )
        DeliveryAttempt.objects.filter(
            claim_token=claim.token, reminder_id__in=ids, outcome=DeliveryAttempt.Outcome.IN_FLIGHT
        ).update(outcome=DeliveryAttempt.Outcome.NOT_STARTED, finished_at=now)
    return released
