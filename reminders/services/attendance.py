"""What an attendee does through the links in their messages: cancel their own enrollment,
or unsubscribe from a workshop's messages (reminders/attendance.py serves the pages)."""

from __future__ import annotations

import logging

from django.db import transaction

from clock import Clock, default_clock
from reminders.links import reminder_id_from
from reminders.models import Notice, Reminder, StaffDecision
from reminders.services.notices import UNSUBSCRIBED
from workshops.models import Enrollment
from workshops.services import enrollment_cancel

logger = logging.getLogger(__name__)

# How the audit names the one who decided: the attendee, through their own link.
ATTENDEE = "the attendee (their own link)"
CANCEL_REASON = "cancelled by the attendee through the link in their reminder or notice"


def reminder_for_link(token: str, *, purpose: str) -> Reminder | None:
    """Return the reminder a link's token names, or None for a bad token, no such reminder or
    an erased attendee's (whose page would still name the workshop)."""
    pk = reminder_id_from(token, purpose=purpose)
    if pk is None:
        return None
    return (
        Reminder.objects.select_related("workshop", "attendee", "enrollment")
        .filter(pk=pk, attendee__erased_at__isnull=True)
        .first()
    )


def enrollment_cancel_by_attendee(*, reminder: Reminder, clock: Clock | None = None) -> bool:
    """Cancel the reminder's enrollment as the attendee asked (audited); return if it changed."""
    clock = clock or default_clock()
    with transaction.atomic(durable=True):
        enrollment = (
            Enrollment.objects.select_for_update(no_key=True)
            .filter(pk=reminder.enrollment_id, status=Enrollment.Status.ACTIVE)
            .first()
        )
        if enrollment is None:
            return False
        enrollment_cancel(enrollment=enrollment, clock=clock)
        StaffDecision.objects.create(
            action=StaffDecision.Action.CANCEL_ENROLLMENTS,
            actor=None,
            actor_name=ATTENDEE,
            created_at=clock.now(),
            reason=CANCEL_REASON,
            selected=1,
            changed=1,
            reminder_ids=[reminder.pk],
            enrollment_ids=[enrollment.pk],
        )
    logger.info("Enrollment %s cancelled by its attendee's link", reminder.enrollment_id)
    return True


def reminder_unsubscribe(*, reminder: Reminder, clock: Clock | None = None) -> bool:
    """Send the attendee no more messages about this workshop (the enrollment stays).

    Notices not yet sent are silenced. Return whether it changed anything.
    """
    now = (clock or default_clock()).now()
    with transaction.atomic():
        changed = Reminder.objects.filter(pk=reminder.pk, unsubscribed_at__isnull=True).update(
            unsubscribed_at=now
        )
        Notice.objects.filter(reminder=reminder, status=Notice.Status.PENDING).update(
            status=Notice.Status.SILENCED, status_reason=UNSUBSCRIBED, updated_at=now
        )
    return bool(changed)
