"""Data the scan, not the services, must pick up."""

from __future__ import annotations

from datetime import timedelta

from clock import SystemClock


def unplanned_workshop(title: str, attendees: int = 3, *, starts_in=timedelta(hours=2)):
    """Create a workshop starting ``starts_in`` from now (real time) with ``attendees``
    enrolled behind the services' back, so only a scan plans their reminders."""
    from workshops.models import Attendee, Enrollment, Workshop

    now = SystemClock().now()
    workshop = Workshop.objects.create(
        title=title,
        starts_at=now + starts_in,
        ends_at=now + starts_in + timedelta(hours=1),
        timezone="Europe/Berlin",
    )
    people = Attendee.objects.bulk_create(
        Attendee(name=f"P{i}", email=f"p{i}@example.com") for i in range(attendees)
    )
    Enrollment.objects.bulk_create(Enrollment(attendee=p, workshop=workshop) for p in people)
    return workshop
