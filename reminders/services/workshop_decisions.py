"""Staff decisions on workshops: cancel and reinstate, each previewed, reasoned and audited.

Each is one durable transaction: it locks the selected workshops, changes each through the
workshops service (whose signal settles their reminders) and writes a StaffDecision. ``sent``
reminders are never touched; ``sending`` ones are left to their worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Q, QuerySet

from clock import Clock, default_clock
from reminders.models import Reminder, StaffDecision
from reminders.policy import ReminderPolicy
from reminders.services.notices import notices_reach, notices_silence, notices_told_count
from reminders.services.replay import clean_reason
from workshops.models import Enrollment, Workshop
from workshops.services import workshop_cancel, workshop_reinstate

logger = logging.getLogger(__name__)

Status = Reminder.Status
Action = StaffDecision.Action


@dataclass(frozen=True, slots=True)
class WorkshopPreview:
    """What a cancel or reinstate of a selection of workshops would do, counted now."""

    action: str
    selected: int
    eligible: int
    skipped: dict[str, int] = field(default_factory=dict)
    # Reminder counts by what happens to them (labels in WORKSHOP_EFFECT_LABELS).
    effects: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkshopDecisionResult:
    action: str
    selected: int
    changed: int
    reminders: int
    skipped: dict[str, int]
    audit_id: int


WORKSHOP_EFFECT_LABELS = {
    "to_cancel": "Reminders that will be cancelled",
    "in_flight": "Reminders being sent right now (no new call starts; their outcome is recorded)",
    "sent": "Reminders already sent (they stay sent)",
    "to_plan": "Cancelled reminders that will be planned again",
    "to_miss": "Cancelled reminders past the cutoff (they become missed)",
    "to_unknown": (
        "Cancelled reminders past the cutoff that may have reached the provider "
        "(they become unknown)"
    ),
    "stay_cancelled": "Reminders whose enrollment is cancelled (they stay cancelled)",
    "to_tell": "Reminded attendees who will be told it is cancelled (a change notice)",
    "to_tell_back": "Attendees told it was cancelled who will be told it is back on",
    "to_silence": "Reminded attendees who will not be told of the latest change",
}
WORKSHOP_SKIP_LABELS = {
    "already_cancelled": "already cancelled",
    "not_cancelled": "not cancelled",
    "nothing_to_tell": "with no reminded attendee to tell of a change",
}


def _selection(workshops: QuerySet[Workshop]) -> QuerySet[Workshop]:
    return Workshop.objects.filter(pk__in=workshops.order_by().values("pk"))


def workshop_cancel_preview(*, workshops: QuerySet[Workshop]) -> WorkshopPreview:
    """Count the workshops a cancel would change and what happens to their reminders."""
    selection = _selection(workshops)
    scheduled = selection.filter(status=Workshop.Status.SCHEDULED)
    counts = Reminder.objects.filter(workshop__in=scheduled.values("pk")).aggregate(
        to_cancel=Count("pk", filter=Q(status__in=Reminder.OPEN_STATUSES)),
        in_flight=Count("pk", filter=Q(status=Status.SENDING)),
        sent=Count("pk", filter=Q(status=Status.SENT)),
    )
    counts["to_tell"] = notices_told_count(workshops=scheduled.values("pk"), cancelled=True)
    total, eligible = _sizes(selection, Workshop.Status.SCHEDULED)
    skipped = {"already_cancelled": total - eligible} if total > eligible else {}
    return WorkshopPreview(Action.CANCEL, total, eligible, skipped, counts)


def workshop_reinstate_preview(
    *, workshops: QuerySet[Workshop], clock: Clock | None = None
) -> WorkshopPreview:
    """Count the workshops a reinstate would change and which reminders come back."""
    now = (clock or default_clock()).now()
    policy = ReminderPolicy.from_settings()
    selection = _selection(workshops)
    cancelled = selection.filter(status=Workshop.Status.CANCELLED)
    active = Q(enrollment__status=Enrollment.Status.ACTIVE)
    late = policy.late_start_q(now, through="workshop__")
    counts = Reminder.objects.filter(
        workshop__in=cancelled.values("pk"), status=Status.CANCELLED
    ).aggregate(
        to_plan=Count("pk", filter=active & ~late),
        to_miss=Count("pk", filter=active & late & Q(maybe_sent=False)),
        to_unknown=Count("pk", filter=active & late & Q(maybe_sent=True)),
        stay_cancelled=Count("pk", filter=~active),
    )
    counts["to_tell_back"] = notices_told_count(
        workshops=cancelled.values("pk"), cancelled=False, clock=clock
    )
    total, eligible = _sizes(selection, Workshop.Status.CANCELLED)
    skipped = {"not_cancelled": total - eligible} if total > eligible else {}
    return WorkshopPreview(Action.REINSTATE, total, eligible, skipped, counts)


def workshop_silence_preview(*, workshops: QuerySet[Workshop]) -> WorkshopPreview:
    """Count the workshops whose reminded attendees have a change to hear of, and how many."""
    selection = _selection(workshops)
    reach = notices_reach(workshops=selection.values("pk"))
    total, eligible = selection.count(), len(reach)
    skipped = {"nothing_to_tell": total - eligible} if total > eligible else {}
    return WorkshopPreview(
        Action.SILENCE_NOTICES, total, eligible, skipped, {"to_silence": sum(reach.values())}
    )


def workshops_silence(
    *,
    workshops: QuerySet[Workshop],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> WorkshopDecisionResult:
    """Tell the reminded attendees of the selected workshops nothing of their latest change.

    With a reason, recorded; the notices not yet sent become ``silenced``.
    """
    reason = clean_reason(reason)
    clock = clock or default_clock()
    with transaction.atomic(durable=True):
        counted = workshop_silence_preview(workshops=workshops)
        audit = StaffDecision.record(
            action=Action.SILENCE_NOTICES,
            actor=actor,
            created_at=clock.now(),
            reason=reason,
            selected=counted.selected,
            changed=0,
            skipped=dict(counted.skipped),
        )
        done, untold = [], 0
        for workshop in _selection(workshops).order_by("pk"):
            left = notices_silence(workshop_id=workshop.pk, decision=audit, clock=clock)
            if left:
                done.append(workshop.pk)
                untold += left
        StaffDecision.objects.filter(pk=audit.pk).update(changed=len(done), workshop_ids=done)
    logger.info(
        "Notices silenced by %s: %s workshops, %s attendees", audit.actor_name, len(done), untold
    )
    return WorkshopDecisionResult(
        Action.SILENCE_NOTICES, counted.selected, len(done), untold, dict(counted.skipped), audit.pk
    )


def _sizes(selection: QuerySet[Workshop], status: str) -> tuple[int, int]:
    sizes = selection.aggregate(total=Count("pk"), eligible=Count("pk", filter=Q(status=status)))
    return sizes["total"], sizes["eligible"]


def workshops_cancel(
    *,
    workshops: QuerySet[Workshop],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> WorkshopDecisionResult:
    """Cancel the scheduled workshops of a selection, with a reason; return what changed."""
    return _decide(
        workshops,
        reason=reason,
        actor=actor,
        clock=clock,
        preview=lambda clock: workshop_cancel_preview(workshops=workshops),
        status=Workshop.Status.SCHEDULED,
        # The attendees already reminded hear of it with this reason (a change notice).
        change=partial(workshop_cancel, reason=clean_reason(reason)),
        affected=Q(status__in=Reminder.OPEN_STATUSES),
        changed=Q(status=Status.CANCELLED),
    )


def workshops_reinstate(
    *,
    workshops: QuerySet[Workshop],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> WorkshopDecisionResult:
    """Reinstate the cancelled workshops of a selection, with a reason; return what changed."""
    return _decide(
        workshops,
        reason=reason,
        actor=actor,
        clock=clock,
        preview=lambda clock: workshop_reinstate_preview(workshops=workshops, clock=clock),
        status=Workshop.Status.CANCELLED,
        change=workshop_reinstate,
        affected=Q(status=Status.CANCELLED),
        changed=~Q(status=Status.CANCELLED),
    )


def _decide(
    workshops: QuerySet[Workshop],
    *,
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None,
    preview,
    status: str,
    change,
    affected: Q,
    changed: Q,
) -> WorkshopDecisionResult:
    """Lock the selected workshops in ``status``, ``change`` each, and record the decision.

    The reminders recorded are those matching ``affected`` before and ``changed`` after.
    """
    reason = clean_reason(reason)
    clock = clock or default_clock()
    with transaction.atomic(durable=True):
        counted = preview(clock)
        targets = _lock(workshops, status)
        before = list(
            Reminder.objects.filter(affected, workshop__in=targets).values_list("pk", flat=True)
        )
        done = [w.pk for w in targets if change(workshop=w, clock=clock).status != status]
        reminders = sorted(
            Reminder.objects.filter(changed, pk__in=before).values_list("pk", flat=True)
        )
        return _record(counted, actor, reason, clock, done, reminders)


def _lock(workshops: QuerySet[Workshop], status: str) -> list[Workshop]:
    """Lock, in id order, the selected workshops still in ``status``.

    ``FOR NO KEY UPDATE``, so a plan's ``FOR KEY SHARE`` (inserting reminders) need not wait.
    """
    return list(
        _selection(workshops)
        .filter(status=status)
        .order_by("pk")
        .select_for_update(of=("self",), no_key=True)
    )


def _record(
    preview: WorkshopPreview,
    actor: AbstractBaseUser,
    reason: str,
    clock: Clock,
    changed: list[int],
    reminders: list[int],
) -> WorkshopDecisionResult:
    skipped = dict(preview.skipped)
    raced = preview.eligible - len(changed)
    if raced > 0:
        skipped["raced"] = raced
    audit = StaffDecision.record(
        action=preview.action,
        actor=actor,
        created_at=clock.now(),
        reason=reason,
        selected=preview.selected,
        changed=len(changed),
        skipped=skipped,
        reminder_ids=reminders,
        workshop_ids=changed,
    )
    logger.info(
        "%s by %s: %s of %s workshops, %s reminders; skipped %s",
        audit.get_action_display(),
        audit.actor_name,
        len(changed),
        preview.selected,
        len(reminders),
        skipped,
    )
    return WorkshopDecisionResult(
        preview.action, preview.selected, len(changed), len(reminders), skipped, audit.pk
    )
