"""The reaper: resolve reminders whose worker vanished while holding them."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from clock import Clock, default_clock
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services._sql import database_now, update_returning
from reminders.services.fate import (
    reminder_fate,
    reminders_locked,
    reminders_return,
    sources_locked,
)
from reminders.services.record import channel_honours_keys

logger = logging.getLogger(__name__)

Status = Reminder.Status


def reminders_reap(*, clock: Clock | None = None) -> dict[str, int]:
    """Resolve reminders whose claim lease expired; return counts by what happened.

    A keyed channel's reminder goes back with the same key, its fate re-derived (``unknown``
    past its deadline or the cap); any other becomes ``unknown``, as the lost worker may have
    reached the provider. Rows change only while ``sending`` with an expired lease, so a racing
    record wins whole or changes nothing. The lease outlasts Celery's hard time limit.
    """
    clock = clock or default_clock()
    # The claim stamped the lease by the database's clock: judge it by that too.
    now = database_now(clock)
    expired = Q(status=Status.SENDING, lease_expires_at__lte=now)
    rows = list(
        Reminder.objects.filter(expired).values_list("id", "channel", "attempts", "claim_token")
    )
    counts = {"requeued": 0, "unknown": 0, "cancelled": 0}
    if not rows:
        return counts
    cap = settings.REMINDERS_MAX_ATTEMPTS
    tokens = {pk: token for pk, _, _, token in rows}
    keyed = {pk: attempts for pk, channel, attempts, _ in rows if channel_honours_keys(channel)}
    gave_up = reasons.GAVE_UP.format(attempts=cap, error=reasons.LEASE_LOST)
    blind = [pk for pk in tokens if pk not in keyed]
    policy = ReminderPolicy.from_settings()
    with transaction.atomic():
        fates = {
            pk: reminder_fate(
                source=source,
                policy=policy,
                now=now,
                late_reason=reasons.LATE_IN_RETRY.format(error=reasons.LEASE_LOST),
                maybe_sent=True,  # the lost worker may have called the provider
                gave_up=gave_up if keyed[pk] >= cap else "",
            )
            for pk, source in sources_locked(keyed).items()
        }
        reminders_locked(tokens, expired)
        changed = reminders_return(
            fates=fates, guard=expired, now=now, errors=dict.fromkeys(fates, reasons.LEASE_LOST)
        )
        closed = {"last_error": reasons.LEASE_LOST, "claim_token": None, "lease_expires_at": None}
        changed.update(
            update_returning(
                Reminder.objects.filter(expired, id__in=blind),
                status=Status.UNKNOWN,
                status_reason=reasons.LEASE_LOST,
                maybe_sent=True,
                updated_at=now,
                **closed,
            )
        )
        if changed:
            DeliveryAttempt.objects.filter(
                reminder_id__in=list(changed),
                claim_token__in={tokens[pk] for pk in changed},
                outcome=DeliveryAttempt.Outcome.IN_FLIGHT,
            ).update(
                outcome=DeliveryAttempt.Outcome.LEASE_EXPIRED,
                finished_at=now,
                error=reasons.LEASE_LOST,
            )
    for status in changed.values():
        counts["requeued" if status == Status.PENDING else str(status)] += 1
    if changed:
        logger.warning("Reaped expired leases: %s", {k: v for k, v in counts.items() if v})
    return counts
