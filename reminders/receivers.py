"""React to workshop and enrollment changes inside their transactions."""

from __future__ import annotations

from django.dispatch import receiver

from workshops.signals import enrollment_changed, workshop_changed


@receiver(workshop_changed, dispatch_uid="reminders.on_workshop_changed")
def on_workshop_changed(sender, *, workshop, changed, **kwargs) -> None:
    from reminders.services import reminders_follow_workshop

    reminders_follow_workshop(workshop=workshop, changed=changed)


@receiver(enrollment_changed, dispatch_uid="reminders.on_enrollment_changed")
def on_enrollment_changed(sender, *, enrollment, created, **kwargs) -> None:
    from reminders.services import reminders_follow_enrollment

    reminders_follow_enrollment(enrollment=enrollment)
