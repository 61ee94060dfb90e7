"""Staff cancelling enrollments: previewed, reasoned and audited, as a workshop cancel is.

One durable transaction locks the active enrollments in id order (``FOR NO KEY UPDATE``, the
staff lock), cancels each through the workshops service, whose signal cancels its unsent
reminder, and writes a StaffDecision. ``sent`` stays sent; ``sending`` is left to its worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, Q, QuerySet

from clock import Clock, default_clock
from reminders.models import Reminder, StaffDecision
from reminders.services.replay import clean_reason
from workshops.models import Enrollment
from workshops.services import enrollment_cancel

logger = logging.getLogger(__name__)

Status = Reminder.Status

ENROLLMENT_SKIP_LABELS = {
    "already_cancelled": "already cancelled",
    "raced": "changed meanwhile",
    "enrollments_not_found": "selected enrollments no longer exist",
}


@dataclass(frozen=True, slots=True)
class EnrollmentPreview:
    """What cancelling a selection of enrollments would do, counted now."""

    selected: int
    eligible: int
    skipped: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EnrollmentDecisionResult:
    selected: int
    changed: int
    reminders: int
    skipped: dict[str, int]
    audit_id: int


ENROLLMENT_EFFECT_LABELS = {
    "to_cancel": "Reminders that will be cancelled",
    "in_flight": "Reminders being sent right now (no new call starts; their outcome is recorded)",
    "sent": "Reminders already sent (they stay sent)",
}


def _selection(enrollments: QuerySet[Enrollment]) -> QuerySet[Enrollment]:
    return Enrollment.objects.filter(pk__in=enrollments.order_by().values("pk"))


def enrollment_cancel_preview(*, enrollments: QuerySet[Enrollment]) -> EnrollmentPreview:
    """Count the enrollments a cancel would change and what happens to their reminders."""
    selection = _selection(enrollments)
    sizes = selection.aggregate(
        total=Count("pk"), eligible=Count("pk", filter=Q(status=Enrollment.Status.ACTIVE))
    )
    active = selection.filter(status=Enrollment.Status.ACTIVE)
    effects = Reminder.objects.filter(enrollment__in=active.values("pk")).aggregate(
        to_cancel=Count("pk", filter=Q(status__in=Reminder.OPEN_STATUSES)),
        in_flight=Count("pk", filter=Q(status=Status.SENDING)),
        sent=Count("pk", filter=Q(status=Status.SENT)),
    )
    total, eligible = sizes["total"], sizes["eligible"]
    skipped = {"already_cancelled": total - eligible} if total > eligible else {}
    return EnrollmentPreview(total, eligible, skipped, effects)


def enrollments_cancel(
    *,
    enrollments: QuerySet[Enrollment],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> EnrollmentDecisionResult:
    """Cancel the active enrollments of a selection, with a reason; return what changed."""
    reason = clean_reason(reason)
    clock = clock or default_clock()
    with transaction.atomic(durable=True):
        counted = enrollment_cancel_preview(enrollments=enrollments)
        targets = list(
            _selection(enrollments)
            .filter(status=Enrollment.Status.ACTIVE)
            .order_by("pk")
            .select_for_update(no_key=True)
        )
        before = list(
            Reminder.objects.filter(
                status__in=Reminder.OPEN_STATUSES, enrollment__in=targets
            ).values_list("pk", flat=True)
        )
        done = [
            e
            for e in targets
            if enrollment_cancel(enrollment=e, clock=clock).status == Enrollment.Status.CANCELLED
        ]
        reminders = sorted(
            Reminder.objects.filter(status=Status.CANCELLED, pk__in=before).values_list(
                "pk", flat=True
            )
        )
        skipped = dict(counted.skipped)
        if counted.eligible > len(done):
            skipped["raced"] = counted.eligible - len(done)
        audit = StaffDecision.record(
            action=StaffDecision.Action.CANCEL_ENROLLMENTS,
            actor=actor,
            created_at=clock.now(),
            reason=reason,
            selected=counted.selected,
            changed=len(done),
            skipped=skipped,
            reminder_ids=reminders,
            enrollment_ids=[e.pk for e in done],
        )
    logger.info(
        "%s by %s: %s of %s enrollments, %s reminders; skipped %s",
        audit.get_action_display(),
        audit.actor_name,
        len(done),
        counted.selected,
        len(reminders),
        skipped,
    )
    return EnrollmentDecisionResult(counted.selected, len(done), len(reminders), skipped, audit.pk)
