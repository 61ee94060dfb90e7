"""Who may push enrolments in, and how their own ids map to ours.

An integration is one outside system (a shop, a form, an LMS). It holds API
tokens, each stored as a SHA-256 digest of a random secret and shown once, and
its own ids for workshops and attendees. Those ids are unique per integration;
the attendee they name is the one attendee with that email (emails are unique
case-insensitively across every integration and the admin).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from workshops.models import Attendee, Workshop


class Integration(models.Model):
    name = models.CharField(
        max_length=100, unique=True, help_text="The outside system, e.g. 'shop' or 'lms'."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    class Scope(models.TextChoices):
        READ = "read", "Read workshops, attendees, enrolments and reminders"
        ENROLMENTS = "enrolments", "Upsert attendees, create and cancel enrolments"
        WORKSHOPS = "workshops", "Create, change, cancel and reinstate workshops"

    integration = models.ForeignKey(Integration, on_delete=models.PROTECT, related_name="tokens")
    name = models.CharField(max_length=100, help_text="What it is for, e.g. 'production'.")
    prefix = models.CharField(
        max_length=12, editable=False, help_text="The token's first characters, to tell it apart."
    )
    digest = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(default=list, help_text="What it may do.")
    created_at = models.DateTimeField(editable=False)
    created_by = models.CharField(max_length=150, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.CharField(max_length=150, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["integration", "-created_at"]
        verbose_name = "API token"
        permissions = [("revoke_apitoken", "Can revoke API tokens")]

    def __str__(self) -> str:
        return f"{self.integration.name}/{self.name} ({self.prefix}…)"

    @property
    def label(self) -> str:
        """How decisions and audits name it."""
        return f"api:{self.integration.name}/{self.name}"


class WorkshopRef(models.Model):
    """An integration's own id for one of our workshops."""

    integration = models.ForeignKey(Integration, on_delete=models.CASCADE, related_name="+")
    external_id = models.CharField(max_length=200)
    workshop = models.ForeignKey(Workshop, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["integration", "external_id"], name="workshopref_unique_external_id"
            ),
            models.UniqueConstraint(
                fields=["integration", "workshop"], name="workshopref_one_per_workshop"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.external_id} -> workshop {self.workshop_id}"


class AttendeeRef(models.Model):
    """An integration's own id for one of our attendees.

    ``created_attendee``: the integration created the attendee through the API. While no
    other integration holds an id for them, their details are its to change
    (intake.services); anyone else's attendee it may enrol and name, not change.
    """

    integration = models.ForeignKey(Integration, on_delete=models.CASCADE, related_name="+")
    external_id = models.CharField(max_length=200)
    attendee = models.ForeignKey(Attendee, on_delete=models.CASCADE, related_name="+")
    # default: a new ref in Python; db_default: one older code writes during a rolling
    # deploy is not the integration's own (the safe side).
    created_attendee = models.BooleanField(
        default=False,
        db_default=False,
        editable=False,
        help_text="The integration created this attendee through the API.",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["integration", "external_id"], name="attendeeref_unique_external_id"
            ),
            models.UniqueConstraint(
                fields=["integration", "attendee"], name="attendeeref_one_per_attendee"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.external_id} -> attendee {self.attendee_id}"


class ApiWrite(models.Model):
    """One write the API accepted, attributed to its token (append-only)."""

    token = models.ForeignKey(ApiToken, on_delete=models.PROTECT, related_name="writes")
    token_label = models.CharField(max_length=220)
    created_at = models.DateTimeField()
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=300)
    status = models.PositiveSmallIntegerField()
    summary = models.JSONField(default=dict, help_text="What it did, counted, with the ids.")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API write"

    def __str__(self) -> str:
        return f"{self.method} {self.path} by {self.token_label}"


class CsvTransfer(models.Model):
    """One CSV import into, or export of, a workshop's attendees by staff (append-only)."""

    class Kind(models.TextChoices):
        IMPORT = "import", "Import"
        EXPORT = "export", "Export"

    kind = models.CharField(max_length=8, choices=Kind.choices, editable=False)
    workshop = models.ForeignKey(
        Workshop, on_delete=models.PROTECT, related_name="+", editable=False
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    actor_name = models.CharField(max_length=150, editable=False)
    created_at = models.DateTimeField(editable=False)
    filename = models.CharField(max_length=255, blank=True, editable=False)
    integration = models.CharField(
        max_length=100,
        blank=True,
        editable=False,
        help_text="Whose ids the file's external_id column holds.",
    )
    rows = models.PositiveIntegerField(default=0, editable=False)
    created = models.PositiveIntegerField(
        default=0, editable=False, help_text="Enrolments the import created."
    )
    request_token = models.CharField(
        max_length=32,
        null=True,
        blank=True,
        unique=True,
        editable=False,
        help_text="The one-time token of the preview it confirmed: a confirmation posted "
        "twice records one import.",
    )
    unchanged = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "CSV import or export"
        verbose_name_plural = "CSV imports and exports"
        permissions = [
            ("import_attendees", "Can import attendees into a workshop from CSV"),
            ("export_attendees", "Can export a workshop's attendees and reminder statuses"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.rows} rows by {self.actor_name}"
