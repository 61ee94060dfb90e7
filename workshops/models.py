"""Workshops, attendees and enrollments.

These models hold facts only. They know nothing of reminders, timers or
queues: deadlines and scheduling belong to the reminders app, which reads
these tables; this app never imports it.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Lower

from workshops.placeholders import validate_notice_text, validate_reminder_text
from workshops.validators import validate_join_url, validate_zone

SUBJECT_HELP = "Blank: the built-in subject in the attendee's language. Placeholders allowed."
INTRO_HELP = (
    "The opening of the message, before the fixed lines (when, where, join link, organiser). "
    "Blank: the built-in greeting in the attendee's language. Placeholders allowed."
)


def language_field(**kwargs) -> models.CharField:
    return models.CharField(max_length=8, choices=settings.LANGUAGES, **kwargs)


class Workshop(models.Model):
    class Status(models.TextChoices):
        SCHEDULED = "scheduled", "Scheduled"
        CANCELLED = "cancelled", "Cancelled"

    title = models.CharField(max_length=200)
    starts_at = models.DateTimeField(help_text="Start, stored in UTC.")
    ends_at = models.DateTimeField(help_text="End, stored in UTC.")
    timezone = models.CharField(
        max_length=64,
        validators=[validate_zone],
        help_text="IANA zone the workshop is held in, e.g. Europe/Berlin.",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SCHEDULED)
    # default: an unsaved or just-created workshop holds '' (with db_default
    # alone it would hold an expression until read back). db_default: rows
    # written without these columns (older code during a rolling deploy, bulk
    # loads) get '' instead of failing NOT NULL.
    location = models.CharField(
        max_length=300,
        blank=True,
        default="",
        db_default="",
        help_text="Where it is held: a room and address, or 'Online'.",
    )
    join_url = models.URLField(
        "join link",
        max_length=500,
        blank=True,
        default="",
        db_default="",
        validators=[validate_join_url],
        help_text="The link attendees open to join (https), if it is held online.",
    )
    contact_name = models.CharField(
        "organiser",
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="Who organises it, as attendees see it.",
    )
    contact_email = models.EmailField(
        "organiser's email",
        blank=True,
        default="",
        db_default="",
        help_text="Replies to a reminder go here, and calendars show it as the organiser.",
    )
    language = language_field(
        default=settings.LANGUAGE_CODE,
        db_default=settings.LANGUAGE_CODE,
        help_text="The language of the text below, and of reminders to attendees with none.",
    )
    reminder_subject = models.CharField(
        "reminder subject",
        max_length=200,
        blank=True,
        default="",
        db_default="",
        validators=[validate_reminder_text],
        help_text=SUBJECT_HELP,
    )
    reminder_intro = models.TextField(
        "reminder intro",
        blank=True,
        default="",
        db_default="",
        validators=[validate_reminder_text],
        help_text=INTRO_HELP,
    )
    notice_intro = models.TextField(
        "change notice intro",
        blank=True,
        default="",
        db_default="",
        validators=[validate_notice_text],
        help_text=(
            "The opening of the notice an already reminded attendee gets when the workshop "
            "moves, changes place or link, is cancelled or is back on. Blank: the built-in "
            "text in the attendee's language. Placeholders allowed, and {old_start_local}, "
            "{old_end_local}, {old_location}, {old_join_url}, {cancellation_reason}."
        ),
    )
    cancellation_reason = models.TextField(
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text="Why staff cancelled it, as attendees are told (blank while scheduled).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["starts_at", "id"]
        permissions = [("cancel_workshop", "Can cancel and reinstate workshops")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")),
                name="workshop_ends_after_start",
                violation_error_message="The end must be after the start.",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["scheduled", "cancelled"]),
                name="workshop_status_valid",
            ),
        ]
        indexes = [models.Index(fields=["status", "starts_at"], name="workshop_status_start")]

    def __str__(self) -> str:
        return f"{self.title} ({self.local_start():%Y-%m-%d %H:%M %Z})"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        for field in ("starts_at", "ends_at"):
            value = getattr(self, field)
            if value is not None and value.tzinfo is None:
                errors[field] = (
                    "Give a time zone with the time (an aware datetime), not a naive one."
                )
        if not errors and self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            errors["ends_at"] = "The end must be after the start."
        if errors:
            raise ValidationError(errors)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def local_start(self):
        return self.starts_at.astimezone(self.zone)

    @property
    def is_scheduled(self) -> bool:
        return self.status == self.Status.SCHEDULED


class Attendee(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(max_length=254)
    timezone = models.CharField(
        max_length=64,
        blank=True,
        validators=[validate_zone],
        help_text="Optional IANA zone; reminders show times in it, else in the workshop's.",
    )
    language = language_field(
        blank=True,
        default="",
        db_default="",
        help_text="Reminders are written in it; blank: in the workshop's language.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    erased_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When staff erased this attendee's personal data (name and email replaced).",
    )

    class Meta:
        ordering = ["email"]
        permissions = [("erase_attendee", "Can erase an attendee's personal data")]
        constraints = [
            models.UniqueConstraint(
                Lower("email"),
                name="attendee_email_ci_unique",
                violation_error_message="An attendee with this email already exists.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Enrollment(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        CANCELLED = "cancelled", "Cancelled"

    attendee = models.ForeignKey(Attendee, on_delete=models.CASCADE, related_name="enrollments")
    workshop = models.ForeignKey(Workshop, on_delete=models.CASCADE, related_name="enrollments")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workshop", "attendee"]
        constraints = [
            models.UniqueConstraint(
                fields=["attendee", "workshop"],
                name="enrollment_unique_attendee_workshop",
                violation_error_message="This attendee is already enrolled in this workshop.",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["active", "cancelled"]),
                name="enrollment_status_valid",
            ),
        ]
        indexes = [models.Index(fields=["workshop", "status"], name="enrollment_workshop_status")]
        permissions = [("cancel_enrollment", "Can cancel enrollments")]

    def __str__(self) -> str:
        return f"{self.attendee} in {self.workshop.title}"


class WorkshopText(models.Model):
    """A workshop's reminder text in a language other than its own.

    An attendee whose language has a row here gets its subject and intro
    (each blank one: the built-in text in that language); any other attendee
    gets the workshop's own text. The fixed lines are in the attendee's
    language either way.
    """

    workshop = models.ForeignKey(Workshop, on_delete=models.CASCADE, related_name="texts")
    language = language_field()
    reminder_subject = models.CharField(
        "reminder subject",
        max_length=200,
        blank=True,
        validators=[validate_reminder_text],
        help_text=SUBJECT_HELP,
    )
    reminder_intro = models.TextField(
        "reminder intro", blank=True, validators=[validate_reminder_text], help_text=INTRO_HELP
    )

    class Meta:
        ordering = ["workshop", "language"]
        verbose_name = "reminder text in another language"
        verbose_name_plural = "reminder texts in other languages"
        constraints = [
            models.UniqueConstraint(
                fields=["workshop", "language"],
                name="workshop_text_unique_language",
                violation_error_message="This workshop already has a text in this language.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_language_display()} text of {self.workshop.title}"

    def clean(self) -> None:
        # The workshop may be unsaved yet (an admin add page, "Save as new"): no id, same rule.
        workshop = getattr(self, "workshop", None)
        if workshop is not None and self.language == workshop.language:
            raise ValidationError(
                {
                    "language": "This is the workshop's own language: write its text in the "
                    "workshop's reminder subject and intro instead."
                }
            )
