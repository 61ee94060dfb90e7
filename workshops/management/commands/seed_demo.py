"""Create a realistic demo data set: workshops across zones, attendees, enrollments."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand
from django.db import transaction

from clock import default_clock
from workshops.models import Workshop, WorkshopText
from workshops.services import (
    attendee_get_or_create,
    enrollment_cancel,
    enrollment_create,
    workshop_cancel,
    workshop_create,
)

DEMO_MARKER = "[demo]"

# (title, zone, starts in, duration, attendees' names)
WORKSHOPS = [
    ("Intro to Django admin", "Europe/Berlin", timedelta(hours=2), timedelta(hours=2)),
    (
        "Celery in production",
        "America/New_York",
        timedelta(hours=3, minutes=15),
        timedelta(hours=1),
    ),
    ("Async Python deep dive", "Asia/Tokyo", timedelta(hours=5), timedelta(hours=3)),
    ("PostgreSQL for app developers", "Australia/Sydney", timedelta(hours=8), timedelta(hours=2)),
    (
        "Starting very soon (inside the cutoff)",
        "Europe/London",
        timedelta(minutes=20),
        timedelta(hours=1),
    ),
    ("Cancelled: Redis internals", "Europe/Paris", timedelta(hours=4), timedelta(hours=1)),
    (
        "Next week: Testing with pytest",
        "America/Los_Angeles",
        timedelta(days=7),
        timedelta(hours=2),
    ),
]

# (name, email, zone, language: blank is the workshop's)
ATTENDEES = [
    ("Ada Lovelace", "ada@example.com", "Europe/London", ""),
    ("Grace Hopper", "grace@example.com", "America/New_York", ""),
    ("Alan Turing", "alan@example.com", "", ""),
    ("Katherine Johnson", "katherine@example.com", "America/Chicago", ""),
    ("Edsger Dijkstra", "edsger@example.com", "Europe/Amsterdam", ""),
    ("Yukihiro Matsumoto", "matz@example.com", "Asia/Tokyo", ""),
    ("J\u00f6rg M\u00fcller", "joerg@example.com", "Europe/Berlin", "de"),
    ("Ren\u00e9e Desrosiers", "renee@example.com", "America/Toronto", "fr"),
]
# The first workshop's own text, and its text for German speakers (README, "The staff surface").
INTRO = "Hello {attendee_name},\n\nplease bring a laptop with Python 3.11 to {workshop_title}."
GERMAN_INTRO = "Hallo {attendee_name},\n\nbitte bringen Sie einen Laptop mit Python 3.11 mit."


class Command(BaseCommand):
    help = (
        "Create demo workshops (several zones, one inside the cutoff, one cancelled, one a "
        "week away, one with its own text and a German one), attendees (two in German and "
        "French), enrollments (one cancelled) and a staff user 'staff'. "
        "Safe to run twice: existing demo data is left as it is."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--password",
            default="",
            help="Password for the demo staff user (default: a new random one, printed).",
        )
        parser.add_argument("--no-staff", action="store_true", help="Do not create a staff user.")

    def handle(self, *args, password: str, no_staff: bool, **options):
        if not no_staff:
            self._staff(password)
        if Workshop.objects.filter(title__startswith=DEMO_MARKER).exists():
            self.stdout.write("Demo workshops already exist; left unchanged.")
            return
        now = default_clock().now()
        with transaction.atomic():
            people = [
                attendee_get_or_create(name=name, email=email, timezone=zone, language=language)[0]
                for name, email, zone, language in ATTENDEES
            ]
            for index, (title, zone, starts_in, duration) in enumerate(WORKSHOPS):
                workshop = workshop_create(
                    title=f"{DEMO_MARKER} {title}",
                    starts_at=now + starts_in,
                    duration=duration,
                    timezone=zone,
                    # What reminders show besides the time (README, "The staff surface").
                    location="Online" if index % 2 else f"Room {index + 1}, Main building",
                    join_url=f"https://meet.example.com/demo-{index + 1}" if index % 2 else "",
                    contact_name="Demo organiser",
                    contact_email="organiser@example.com",
                    reminder_intro=INTRO if index == 0 else "",
                )
                if index == 0:
                    WorkshopText.objects.create(
                        workshop=workshop, language="de", reminder_intro=GERMAN_INTRO
                    )
                for person in people[index % 3 :: 2]:
                    enrollment_create(attendee=person, workshop=workshop)
                if title.startswith("Cancelled"):
                    workshop_cancel(workshop=workshop)
            first = Workshop.objects.filter(title__startswith=DEMO_MARKER).first()
            enrollment_cancel(enrollment=first.enrollments.order_by("id").first())
        self.stdout.write(
            self.style.SUCCESS(
                f"Created {len(WORKSHOPS)} demo workshops and {len(people)} attendees."
            )
        )

    def _staff(self, password: str) -> None:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username="staff",
            # An address of its own, so "Send me a test" works in the local run (var/outbox/).
            defaults={"is_staff": True, "is_superuser": True, "email": "staff@example.com"},
        )
        if created or password:
            password = password or secrets.token_urlsafe(9)
            user.set_password(password)
            user.is_staff = True
            user.is_superuser = True
            user.save()
            user.user_permissions.add(
                *Permission.objects.filter(
                    content_type__app_label__in=["reminders", "workshops"],
                    codename__in=[
                        "replay_reminder",
                        "resolve_unknown_reminder",
                        "cancel_workshop",
                        "send_test_reminder",
                    ],
                )
            )
            self.stdout.write(
                self.style.SUCCESS(
                    f"Staff login: http://127.0.0.1:8000/admin/  user: staff  password: {password}"
                )
            )
        else:
            self.stdout.write(
                "Staff user 'staff' exists; run seed_demo --password NEW to reset its password."
            )
