"""Staff lift a suppressed address, with a reason, audited."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from clock import Clock, default_clock
from reminders.models import StaffDecision, Suppression
from reminders.selectors import selection_of
from reminders.services.replay import clean_reason, skipped_as


def suppressions_lift(
    *,
    suppressions: QuerySet[Suppression],
    reason: str,
    actor,
    clock: Clock | None = None,
) -> StaffDecision:
    """Lift the live ones of ``suppressions``, recording why and by whom; return the decision."""
    reason = clean_reason(reason)
    now = (clock or default_clock()).now()
    with transaction.atomic(durable=True):
        selected = suppressions.count()
        live = list(
            selection_of(suppressions)
            .filter(lifted_at__isnull=True)
            .order_by("pk")
            .select_for_update()
        )
        decision = StaffDecision.record(
            action=StaffDecision.Action.LIFT_SUPPRESSION,
            actor=actor,
            created_at=now,
            reason=reason,
            selected=selected,
            changed=len(live),
            skipped=skipped_as("already_lifted", selected, len(live)),
            outcome=f"suppressions lifted: {', '.join(str(row.pk) for row in live) or 'none'}",
        )
        Suppression.objects.filter(pk__in=[row.pk for row in live]).update(
            lifted_at=now, lift_decision=decision
        )
    return decision
