"""Staff decisions on workshops (cancel, reinstate, silence), each previewed, reasoned and audited.

Each is one durable transaction: it locks the selected workshops, changes each through the
workshops service (whose signal settles their reminders) and writes a StaffDecision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Q, QuerySet

from clock import Clock, default_clock
from reminders.models import Reminder, StaffDecision
from reminders.policy import ReminderPolicy
from reminders.selectors import selection_of
from reminders.services.notices import (
    notices_pending,
    notices_reach,
    notices_silence,
    notices_told_count,
)
from reminders.services.replay import clean_reason, skipped_as
from workshops.models import Enrollment, Workshop
from workshops.services import workshop_cancel, workshop_reinstate

logger = logging.getLogger(__name__)

Status = Reminder.Status
Action = StaffDecision.Action


@dataclass(frozen=True, slots=True)
class DecisionPreview:
    """What a staff decision on workshops, enrollments or attendees would do, counted now."""

    action: str
    selected: int
    eligible: int
    skipped: dict[str, int] = field(default_factory=dict)
    # Reminder counts by what happens to them (labels in the *_EFFECT_LABELS).
    effects: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DecisionResult:
    action: str
    selected: int
    changed: int
    reminders: int
    skipped: dict[str, int]
    audit_id: int


# What a decision on workshops or enrollments does to their reminders, in the order shown.
EFFECT_LABELS = {
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
    "to_tell_enrollment": (
        "Reminded attendees who will be told their enrollment is cancelled (a change notice)"
    ),
    "to_tell_back": "Attendees told it was cancelled who will be told it is back on",
    "to_silence": "Reminded attendees who will not be told of the latest change",
}


def sizes(selection: QuerySet, status: str) -> tuple[int, int]:
    """Return how many rows the selection has, and how many of them are in ``status``."""
    got = selection.aggregate(total=Count("pk"), eligible=Count("pk", filter=Q(status=status)))
    return got["total"], got["eligible"]


def cancel_effects(reminders: QuerySet[Reminder]) -> dict[str, int]:
    """Count ``reminders`` by what a cancel does to them (labelled in EFFECT_LABELS)."""
    return reminders.aggregate(
        to_cancel=Count("pk", filter=Q(status__in=Reminder.OPEN_STATUSES)),
        in_flight=Count("pk", filter=Q(status=Status.SENDING)),
        sent=Count("pk", filter=Q(status=Status.SENT)),
    )


def workshop_cancel_preview(*, workshops: QuerySet[Workshop]) -> DecisionPreview:
    """Count the workshops a cancel would change and what happens to their reminders."""
    selection = selection_of(workshops)
    scheduled = selection.filter(status=Workshop.Status.SCHEDULED)
    counts = cancel_effects(Reminder.objects.filter(workshop__in=scheduled.values("pk")))
    counts["to_tell"] = notices_told_count(workshops=scheduled.values("pk"), cancelled=True)
    total, eligible = sizes(selection, Workshop.Status.SCHEDULED)
    skipped = skipped_as("already_cancelled", total, eligible)
    return DecisionPreview(Action.CANCEL, total, eligible, skipped, counts)


def workshop_reinstate_preview(
    *, workshops: QuerySet[Workshop], clock: Clock | None = None
) -> DecisionPreview:
    """Count the workshops a reinstate would change and which reminders come back."""
    now = (clock or default_clock()).now()
    policy = ReminderPolicy.from_settings()
    selection = selection_of(workshops)
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
    total, eligible = sizes(selection, Workshop.Status.CANCELLED)
    skipped = skipped_as("not_cancelled", total, eligible)
    return DecisionPreview(Action.REINSTATE, total, eligible, skipped, counts)


def workshop_silence_preview(*, workshops: QuerySet[Workshop]) -> DecisionPreview:
    """Count the workshops whose reminded attendees have a change to hear of, and how many."""
    selection = selection_of(workshops)
    reach = notices_reach(workshops=selection.values("pk"))
    # Planned and not yet sent: a silence silences them too (disjoint: a notice covers its row).
    for pk, pending in notices_pending(workshops=selection.values("pk")).items():
        reach[pk] = reach.get(pk, 0) + pending
    total, eligible = selection.count(), len(reach)
    skipped = skipped_as("nothing_to_tell", total, eligible)
    return DecisionPreview(
        Action.SILENCE_NOTICES, total, eligible, skipped, {"to_silence": sum(reach.values())}
    )


def workshops_silence(
    *,
    workshops: QuerySet[Workshop],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> DecisionResult:
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
        for workshop in selection_of(workshops).order_by("pk"):
            left = notices_silence(workshop_id=workshop.pk, decision=audit, clock=clock)
            if left:
                done.append(workshop.pk)
                untold += left
        # Counted with a change to silence, but told (or changed back) meanwhile.
        skipped = {**counted.skipped, **skipped_as("raced", counted.eligible, len(done))}
        StaffDecision.objects.filter(pk=audit.pk).update(
            changed=len(done), workshop_ids=done, skipped=skipped
        )
    logger.info(
        "Notices silenced by %s: %s workshops, %s attendees", audit.actor_name, len(done), untold
    )
    return DecisionResult(
        Action.SILENCE_NOTICES, counted.selected, len(done), untold, skipped, audit.pk
    )


def workshops_cancel(
    *,
    workshops: QuerySet[Workshop],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
    also: Callable[[DecisionResult], object] | None = None,
) -> DecisionResult:
    """Cancel the scheduled workshops of a selection, with a reason; return what changed."""
    return decide(
        lambda clock: workshop_cancel_preview(workshops=workshops),
        workshops,
        Workshop.Status.SCHEDULED,
        # The attendees already reminded hear of it with this reason (a change notice).
        partial(workshop_cancel, reason=clean_reason(reason)),
        noun="workshop",
        affected=Q(status__in=Reminder.OPEN_STATUSES),
        changed=Q(status=Status.CANCELLED),
        reason=reason,
        actor=actor,
        clock=clock,
        also=also,
    )


def workshops_reinstate(
    *,
    workshops: QuerySet[Workshop],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
    also: Callable[[DecisionResult], object] | None = None,
) -> DecisionResult:
    """Reinstate the cancelled workshops of a selection, with a reason; return what changed."""
    return decide(
        lambda clock: workshop_reinstate_preview(workshops=workshops, clock=clock),
        workshops,
        Workshop.Status.CANCELLED,
        workshop_reinstate,
        noun="workshop",
        affected=Q(status=Status.CANCELLED),
        changed=~Q(status=Status.CANCELLED),
        reason=reason,
        actor=actor,
        clock=clock,
        also=also,
    )


def decide(
    preview: Callable[[Clock], DecisionPreview],
    rows: QuerySet,
    status: str,
    change: Callable[..., Any],
    *,
    noun: str,
    affected: Q,
    changed: Q,
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None,
    also: Callable[[DecisionResult], object] | None = None,
) -> DecisionResult:
    """Count, lock the ``rows`` in ``status``, ``change`` each and record it, in one transaction.

    A row counts as changed if it left ``status``. The reminders recorded are the rows' reminders
    matching ``affected`` before and ``changed`` after. ``noun`` names the rows (``workshop`` or
    ``enrollment``): the reminder's field, ``change``'s argument, the audit's. ``also`` is
    called with the result inside the transaction (the API's record of its write).
    """
    reason = clean_reason(reason)
    clock = clock or default_clock()
    with transaction.atomic(durable=True):
        counted = preview(clock)
        # In id order; FOR NO KEY UPDATE, so a plan's FOR KEY SHARE (inserting reminders) goes on.
        targets = list(
            selection_of(rows)
            .filter(status=status)
            .order_by("pk")
            .select_for_update(of=("self",), no_key=True)
        )
        before = list(
            Reminder.objects.filter(affected, **{f"{noun}__in": targets}).values_list(
                "pk", flat=True
            )
        )
        done = []
        for target in targets:
            if change(**{noun: target}, clock=clock).status != status:
                done.append(target.pk)
        reminders = sorted(
            Reminder.objects.filter(changed, pk__in=before).values_list("pk", flat=True)
        )
        skipped = {**counted.skipped, **skipped_as("raced", counted.eligible, len(done))}
        audit = StaffDecision.record(
            action=counted.action,
            actor=actor,
            created_at=clock.now(),
            reason=reason,
            selected=counted.selected,
            changed=len(done),
            skipped=skipped,
            reminder_ids=reminders,
            **{f"{noun}_ids": done},
        )
        result = DecisionResult(
            counted.action, counted.selected, len(done), len(reminders), skipped, audit.pk
        )
        if also is not None:
            also(result)
    logger.info(
        "%s by %s: %s of %s %ss, %s reminders; skipped %s",
        audit.get_action_display(),
        audit.actor_name,
        len(done),
        counted.selected,
        noun,
        len(reminders),
        skipped,
    )
    return result
