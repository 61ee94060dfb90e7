"""Staff cancelling enrollments: previewed, reasoned and audited, as a workshop cancel is."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Q, QuerySet

from clock import Clock
from reminders.models import Reminder
from reminders.selectors import selection_of
from reminders.services.notices import notices_told_count
from reminders.services.replay import skipped_as
from reminders.services.workshop_decisions import (
    Action,
    DecisionPreview,
    DecisionResult,
    cancel_effects,
    decide,
    sizes,
)
from workshops.models import Enrollment
from workshops.services import enrollment_cancel


def enrollment_cancel_preview(*, enrollments: QuerySet[Enrollment]) -> DecisionPreview:
    """Count the enrollments a cancel would change and what happens to their reminders."""
    selection = selection_of(enrollments)
    total, eligible = sizes(selection, Enrollment.Status.ACTIVE)
    active = selection.filter(status=Enrollment.Status.ACTIVE)
    effects = cancel_effects(Reminder.objects.filter(enrollment__in=active.values("pk")))
    effects["to_tell_enrollment"] = notices_told_count(
        enrollments=active.values("pk"), cancelled=True
    )
    skipped = skipped_as("already_cancelled", total, eligible)
    return DecisionPreview(Action.CANCEL_ENROLLMENTS, total, eligible, skipped, effects)


def enrollments_cancel(
    *,
    enrollments: QuerySet[Enrollment],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
    also: Callable[[DecisionResult], object] | None = None,
) -> DecisionResult:
    """Cancel the active enrollments of a selection, with a reason; return what changed."""
    return decide(
        lambda clock: enrollment_cancel_preview(enrollments=enrollments),
        enrollments,
        Enrollment.Status.ACTIVE,
        enrollment_cancel,
        noun="enrollment",
        affected=Q(status__in=Reminder.OPEN_STATUSES),
        changed=Q(status=Reminder.Status.CANCELLED),
        reason=reason,
        actor=actor,
        clock=clock,
        also=also,
    )
