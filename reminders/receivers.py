"""React to workshop and enrollment changes inside their transactions, and to the reports of
the django channel's provider (django-anymail's tracking signal)."""

from __future__ import annotations

from anymail.signals import tracking
from django.conf import settings
from django.dispatch import receiver

from reminders.services import (
    reminders_follow_enrollment,
    reminders_follow_workshop,
    reminders_plan_enrollments,
)
from reminders.services.feedback import anymail_report, delivery_events_record
from workshops.signals import enrollment_changed, enrollments_added, workshop_changed


@receiver(workshop_changed, dispatch_uid="reminders.on_workshop_changed")
def on_workshop_changed(sender, *, workshop, changed, **kwargs) -> None:
    reminders_follow_workshop(workshop=workshop, changed=changed)


@receiver(enrollment_changed, dispatch_uid="reminders.on_enrollment_changed")
def on_enrollment_changed(sender, *, enrollment, created, **kwargs) -> None:
    reminders_follow_enrollment(enrollment=enrollment)


@receiver(enrollments_added, dispatch_uid="reminders.on_enrollments_added")
def on_enrollments_added(sender, *, enrollment_ids, **kwargs) -> None:
    reminders_plan_enrollments(ids=enrollment_ids)


@receiver(tracking, dispatch_uid="reminders.on_provider_report")
def on_provider_report(sender, *, event, esp_name, **kwargs) -> None:
    if not settings.ANYMAIL_WEBHOOK_SECRET:
        return  # no basic auth: anyone could have sent it
    report = anymail_report(event, esp_name)
    if report is not None:
        delivery_events_record(channel="django", events=[report])
