"""Staff decisions on reminders: replay, and the resolution of unknown outcomes.

Each is one durable transaction: a guarded UPDATE, a dispatch after commit and a StaffDecision.
A concurrent replay of the same rows waits on their locks, re-checks the WHERE and changes
nothing, so each reminder is re-armed and published once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet

from clock import Clock, default_clock
from reminders import queue
from reminders.models import Reminder, StaffDecision
from reminders.policy import ReminderPolicy
from reminders.selectors import (
    REPLAYABLE_STATUSES,
    UNSUBSCRIBED,
    SelectionPreview,
    reminder_replay_preview,
    reminder_resolve_preview,
    selection_of,
)
from reminders.services import reminder_fate, reminders_dispatch, reminders_return, sources_locked
from reminders.services._sql import database_now, update_returning
from reminders.services.dispatch import Publish

logger = logging.getLogger(__name__)

Status = Reminder.Status

REASON_REPLAYED = "replayed by {actor}"
REASON_SENT_AGAIN = "sent again by {actor}: {reason}"
REASON_MARKED_SENT = "marked as sent by {actor}: {reason}"
REASON_MAX_LENGTH = 500


@dataclass(frozen=True, slots=True)
class StaffActionResult:
    """What a replay or a resolution did: counts for the message, and the audit row."""

    action: str
    selected: int
    changed: int
    queued: int
    skipped: dict[str, int] = field(default_factory=dict)
    audit_id: int | None = None
    #: Re-armed with their window open but not queued now: the next scan queues them.
    later: int = 0
    #: Handed to a worker: the counts grow on its StaffDecision row.
    running: bool = False

    @property
    def waiting(self) -> int:
        """Return how many re-armed reminders wait for their send window to open."""
        return self.changed - self.queued - self.later

    @classmethod
    def of(cls, audit: StaffDecision, **extra) -> StaffActionResult:
        """Return the counts ``audit`` recorded."""
        fields = (audit.action, audit.selected, audit.changed, audit.queued, audit.skipped)
        return cls(*fields, audit_id=audit.pk, **extra)


def reminder_replay(
    *,
    reminders: QuerySet[Reminder],
    actor: AbstractBaseUser,
    clock: Clock | None = None,
    publish: Publish | None = None,
    reason: str = "",
    use_edited_text: bool = False,
) -> StaffActionResult:
    """Re-arm the replayable reminders of a selection and queue them for delivery after commit.

    A replayed reminder keeps its frozen text unless ``use_edited_text``.
    """
    clock = clock or default_clock()
    now = clock.now()
    with transaction.atomic(durable=True):
        preview = reminder_replay_preview(reminders=reminders, clock=clock)
        rearmed = _rearm(
            candidates=selection_of(reminders),
            guard=Q(status__in=REPLAYABLE_STATUSES),
            reason=REASON_REPLAYED.format(actor=actor.get_username()),
            now=now,
            use_edited_text=use_edited_text,
        )
        queued = reminders_dispatch(ids=rearmed, clock=clock, publish=publish)
        result = _audit(
            action=StaffDecision.Action.REPLAY,
            actor=actor,
            now=now,
            preview=preview,
            changed=rearmed,
            queued=queued,
            later=_left_for_scan(rearmed, now=now),
            reason=(reason or "").strip()[:REASON_MAX_LENGTH],
            use_edited_text=use_edited_text,
        )
    logger.info(
        "Replay by %s: %s selected, %s re-armed, %s queued, skipped %s%s",
        actor.get_username(),
        result.selected,
        result.changed,
        result.queued,
        result.skipped,
        ", with the edited text" if use_edited_text else "",
    )
    return result


def reminder_resolve_unknown(
    *,
    reminders: QuerySet[Reminder],
    decision: str,
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> StaffActionResult:
    """Decide the reminders of a selection whose outcome is ``unknown``, recording why.

    ``MARK_SENT`` makes them ``sent`` (``sent_at`` stays empty: nobody knows when);
    ``SEND_AGAIN`` re-arms them like a replay, at the risk of a second delivery.
    """
    reason = clean_reason(reason)
    if decision not in (StaffDecision.Action.MARK_SENT, StaffDecision.Action.SEND_AGAIN):
        raise ValidationError(
            {"decision": "Choose 'mark as sent' or 'send again'."}, code="invalid_choice"
        )
    clock = clock or default_clock()
    now = clock.now()
    send_again = decision == StaffDecision.Action.SEND_AGAIN
    actor_name = actor.get_username()
    selection = selection_of(reminders)
    unknown = Q(status=Status.UNKNOWN)
    with transaction.atomic(durable=True):
        preview = reminder_resolve_preview(reminders=reminders, send_again=send_again, clock=clock)
        if send_again:
            changed = _rearm(
                candidates=selection,
                guard=unknown & ~UNSUBSCRIBED,
                reason=REASON_SENT_AGAIN.format(actor=actor_name, reason=reason),
                now=now,
            )
            queued = reminders_dispatch(ids=changed, clock=clock)
            later = _left_for_scan(changed, now=now)
        else:
            changed = sorted(
                pk
                for pk, _ in update_returning(
                    selection.filter(unknown),
                    status=Status.SENT,
                    status_reason=REASON_MARKED_SENT.format(actor=actor_name, reason=reason)[:200],
                    updated_at=now,
                )
            )
            queued = later = 0
        result = _audit(
            action=decision,
            actor=actor,
            now=now,
            preview=preview,
            changed=changed,
            queued=queued,
            later=later,
            reason=reason,
        )
    logger.info(
        "Unknown outcomes resolved by %s (%s): %s changed, %s queued, skipped %s",
        actor_name,
        decision,
        result.changed,
        result.queued,
        result.skipped,
    )
    return result


def clean_reason(reason: str | None) -> str:
    """Return the stripped reason a decision must carry; raise ValidationError if it has none."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError(
            {"reason": "Give a reason: it is recorded with the decision."}, code="required"
        )
    if len(reason) > REASON_MAX_LENGTH:
        raise ValidationError(
            {"reason": f"Shorten the reason to {REASON_MAX_LENGTH} characters or fewer."},
            code="max_length",
        )
    return reason


def skipped_as(key: str, total: int, done: int) -> dict[str, int]:
    """Return ``{key: total - done}``, or nothing if none of ``total`` was left."""
    return {key: total - done} if total > done else {}


def _rearm(
    *,
    candidates: QuerySet[Reminder],
    guard: Q,
    reason: str,
    now: datetime,
    use_edited_text: bool = False,
) -> list[int]:
    """Re-arm the rows of ``candidates`` (a selection) matching ``guard`` whose fate is ``pending``."""
    ids = list(candidates.filter(guard).values_list("pk", flat=True))
    policy = ReminderPolicy.from_settings()
    fates = {}
    for pk, source in sources_locked(ids).items():
        fate = reminder_fate(
            source=source, policy=policy, now=now, late_reason="", open_reason=reason
        )
        if fate.status == Status.PENDING:
            fates[pk] = fate
    extra = {"attempts": 0, **({"text": None} if use_edited_text else {})}
    return sorted(reminders_return(fates=fates, guard=guard, now=now, extra=extra))


def _left_for_scan(ids: list[int], *, now: datetime) -> int:
    """Count the re-armed reminders whose window is open but that were not queued."""
    if not ids:
        return 0
    policy = ReminderPolicy.from_settings()
    return Reminder.objects.filter(
        policy.open_start_q(now, through="workshop__"), pk__in=ids, status=Status.PENDING
    ).count()


def reminder_replay_selection(
    *,
    reminders: QuerySet[Reminder],
    actor: AbstractBaseUser,
    reason: str = "",
    use_edited_text: bool = False,
) -> StaffActionResult:
    """Replay a staff selection: inline up to REMINDERS_REPLAY_INLINE_LIMIT, else on a worker."""
    replay = (
        reminder_replay_later
        if selection_of(reminders).count() > settings.REMINDERS_REPLAY_INLINE_LIMIT
        else reminder_replay
    )
    return replay(reminders=reminders, actor=actor, reason=reason, use_edited_text=use_edited_text)


def reminder_replay_later(
    *,
    reminders: QuerySet[Reminder],
    actor: AbstractBaseUser,
    reason: str = "",
    clock: Clock | None = None,
    publish_task: Callable[[int], object] | None = None,
    use_edited_text: bool = False,
) -> StaffActionResult:
    """Record a replay of a large selection and hand it to a worker after commit.

    The ids are kept on the decision: the worker replays what staff confirmed.
    """
    clock = clock or default_clock()
    now = clock.now()
    with transaction.atomic(durable=True):
        preview = reminder_replay_preview(reminders=reminders, clock=clock)
        ids = sorted(selection_of(reminders).values_list("pk", flat=True))
        audit = StaffDecision.record(
            action=StaffDecision.Action.REPLAY,
            state=StaffDecision.State.RUNNING,
            actor=actor,
            created_at=now,
            reason=(reason or "").strip()[:REASON_MAX_LENGTH],
            selected=preview.selected,
            changed=0,
            skipped=dict(preview.skipped),
            selection_ids=ids,
            use_edited_text=use_edited_text,
            heartbeat_at=database_now(clock),
        )
        publish = publish_task or queue.publish_replay
        transaction.on_commit(lambda: publish(audit.pk))
    logger.info(
        "Replay by %s of %s reminders handed to a worker (decision %s)",
        audit.actor_name,
        preview.selected,
        audit.pk,
    )
    return StaffActionResult.of(audit, running=True)


def replay_step(
    *,
    decision_id: int,
    clock: Clock | None = None,
    publish: Publish | None = None,
    chunk: int | None = None,
) -> StaffDecision:
    """Re-arm and queue the next chunk of a background replay, or close it when none is left.

    ``progress`` moves in the chunk's transaction under the decision's lock, so a lost or
    redelivered task resumes after the last chunk.
    """
    clock = clock or default_clock()
    chunk = chunk or settings.REMINDERS_REPLAY_CHUNK
    with transaction.atomic(durable=True):
        decision = StaffDecision.objects.select_for_update().get(pk=decision_id)
        if decision.state == StaffDecision.State.DONE:
            return decision
        now = clock.now()
        decision.heartbeat_at = database_now(clock)
        ids = decision.selection_ids[decision.progress : decision.progress + chunk]
        if not ids:
            eligible = decision.selected - sum(decision.skipped.values())
            decision.skipped |= skipped_as("raced", eligible, decision.changed)
            decision.state = StaffDecision.State.DONE
            decision.selection_ids = []
            decision.save(update_fields=["state", "selection_ids", "skipped", "heartbeat_at"])
            return decision
        rearmed = _rearm(
            candidates=Reminder.objects.filter(pk__in=ids),
            guard=Q(status__in=REPLAYABLE_STATUSES),
            reason=REASON_REPLAYED.format(actor=decision.actor_name),
            now=now,
            use_edited_text=decision.use_edited_text,
        )
        decision.queued += reminders_dispatch(ids=rearmed, clock=clock, publish=publish)
        decision.changed += len(rearmed)
        decision.progress += len(ids)
        decision.reminder_ids = sorted([*decision.reminder_ids, *rearmed])
        decision.save(
            update_fields=["queued", "changed", "progress", "reminder_ids", "heartbeat_at"]
        )
        return decision


def _audit(
    *,
    action: str,
    actor: AbstractBaseUser,
    now: datetime,
    preview: SelectionPreview,
    changed: list[int],
    queued: int,
    later: int,
    reason: str,
    use_edited_text: bool = False,
) -> StaffActionResult:
    # Counted eligible, but taken first by a concurrent replay or a worker.
    skipped = {**preview.skipped, **skipped_as("raced", preview.eligible, len(changed))}
    audit = StaffDecision.record(
        action=action,
        actor=actor,
        created_at=now,
        reason=reason,
        selected=preview.selected,
        changed=len(changed),
        queued=queued,
        skipped=skipped,
        reminder_ids=sorted(changed),
        use_edited_text=use_edited_text,
    )
    return StaffActionResult.of(audit, later=later)
