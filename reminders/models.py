"""Reminders and their delivery attempts.

One Reminder per (attendee, workshop), by a unique constraint: the sent marker. A status changes
only through a guarded UPDATE in ``reminders.services`` (never ``save()``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from reminders.policy import ReminderPolicy
from workshops.models import Attendee, Enrollment, Workshop

# The largest primary key the database holds (BigAutoField: signed 64-bit).
MAX_ID = 2**63 - 1


def id_from_text(value: str) -> int | None:
    """Return the primary key ``value`` spells in ASCII digits, or None if it names none."""
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > len(str(MAX_ID)):
        return None
    number = int(value)
    return number if 0 < number <= MAX_ID else None


def reminder_key(*, attendee_id: int, workshop_id: int) -> str:
    """Return the reminder's idempotency key (reminders_plan builds the same text in SQL)."""
    return f"{settings.REMINDERS_KEY_PREFIX}-w{workshop_id}-a{attendee_id}"


def notice_key(*, attendee_id: int, workshop_id: int, revision: int) -> str:
    """Return the idempotency key of one revision's change notice."""
    return f"{reminder_key(attendee_id=attendee_id, workshop_id=workshop_id)}-r{revision}"


class Reminder(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending (window not open or not yet queued)"
        QUEUED = "queued", "Queued"
        SENDING = "sending", "Sending (claimed by a worker)"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"
        MISSED = "missed", "Missed (deadline passed)"
        CANCELLED = "cancelled", "Cancelled"
        UNKNOWN = "unknown", "Unknown (may have reached the provider)"

    # Statuses in which the reminder may still be sent automatically.
    OPEN_STATUSES = (Status.PENDING, Status.QUEUED)
    # Statuses that end the reminder's life unless staff act.
    FINAL_STATUSES = (Status.SENT, Status.FAILED, Status.MISSED, Status.CANCELLED, Status.UNKNOWN)

    # No index of its own: the unique (attendee, workshop) leads with it, and every claim and
    # record would write both.
    attendee = models.ForeignKey(
        Attendee, on_delete=models.PROTECT, related_name="reminders", db_index=False
    )
    workshop = models.ForeignKey(Workshop, on_delete=models.PROTECT, related_name="reminders")
    enrollment = models.ForeignKey(Enrollment, on_delete=models.PROTECT, related_name="reminders")
    key = models.CharField(max_length=64, unique=True, editable=False)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, editable=False
    )
    status_reason = models.CharField(max_length=200, blank=True, editable=False)
    next_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    attempts = models.PositiveIntegerField(default=0, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    queued_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When the broker message carrying this reminder expires.",
    )
    queued_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=(
            "When this reminder last entered the queue: a new message for a row still "
            "queued (its old one expired), a move or an edit keep this time."
        ),
    )
    maybe_sent = models.BooleanField(
        default=False,
        db_default=False,
        editable=False,
        verbose_name="may have reached the provider",
        help_text=(
            "Set once a call for this reminder ended without a definite answer (timed out, "
            "stopped mid-call, worker lost) and never cleared: from then on, past its "
            "deadline, at its attempt cap or refused by the provider, it is marked unknown, "
            "not missed or failed. A row already missed or failed when the upgrade set it "
            "keeps that status."
        ),
    )
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    channel = models.CharField(max_length=16, blank=True, editable=False)
    provider_message_id = models.CharField(max_length=255, blank=True, editable=False)
    sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    sent_to = models.EmailField(
        max_length=254,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text="The address its last claim's message went to: a provider's bounce or "
        "complaint suppresses it, even after the attendee's address was corrected.",
    )
    text = models.ForeignKey(
        "MessageText",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        editable=False,
        help_text="The language and text frozen at the first claim; every later send uses it.",
    )
    # What the attendee was last told: written by each claim (what its message shows), then by
    # each notice (perhaps) sent. History, not a deadline: notices compare it with the workshop.
    told_starts_at = models.DateTimeField(null=True, blank=True, editable=False)
    told_ends_at = models.DateTimeField(null=True, blank=True, editable=False)
    told_location = models.CharField(
        max_length=300, blank=True, default="", db_default="", editable=False
    )
    told_join_url = models.CharField(
        max_length=500, blank=True, default="", db_default="", editable=False
    )
    told_cancelled = models.BooleanField(default=False, db_default=False, editable=False)
    told_revision = models.PositiveIntegerField(
        default=0,
        db_default=0,
        editable=False,
        help_text="The workshop revision the attendee last heard of (0: the reminder's own facts).",
    )
    unsubscribed_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When the attendee unsubscribed from this workshop's messages (their mail "
        "client's one-click unsubscribe): no change notice follows; the enrollment stays.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["attendee", "workshop"], name="reminder_unique_attendee_workshop"
            ),
            models.CheckConstraint(
                condition=models.Q(
                    status__in=[
                        "pending",
                        "queued",
                        "sending",
                        "sent",
                        "failed",
                        "missed",
                        "cancelled",
                        "unknown",
                    ]
                ),
                name="reminder_status_valid",
            ),
            # A claim token is held exactly while sending: fencing by the token alone is
            # fencing by the claim (and the primary key, not an index of status, finds rows).
            models.CheckConstraint(
                condition=models.Q(
                    status="sending", claim_token__isnull=False, lease_expires_at__isnull=False
                )
                | (~models.Q(status="sending") & models.Q(claim_token__isnull=True)),
                name="reminder_claimed_while_sending",
            ),
        ]
        indexes = [
            # Open rows by workshop: dispatch and settle judge them by its start.
            models.Index(
                fields=["workshop", "id"],
                name="reminder_open_by_workshop",
                condition=models.Q(status__in=["pending", "queued"]),
            ),
            # The rows the settle may reopen when their workshop changes back.
            models.Index(
                fields=["workshop"],
                name="reminder_reopenable",
                condition=models.Q(status__in=["missed", "cancelled"]),
            ),
            # Counts by status (health page, metrics).
            models.Index(fields=["status"], name="reminder_status"),
            models.Index(
                fields=["lease_expires_at"],
                name="reminder_sending_lease",
                condition=models.Q(status="sending"),
            ),
        ]
        permissions = [
            ("replay_reminder", "Can replay reminders"),
            ("resolve_unknown_reminder", "Can decide reminders whose outcome is unknown"),
            ("send_test_reminder", "Can send themselves a test of a workshop's reminder"),
        ]

    def __str__(self) -> str:
        return f"Reminder {self.key} ({self.status})"

    @classmethod
    def due_q(cls, now, policy: ReminderPolicy) -> models.Q:
        """Return "the scan queues it now" as a filter: pending or queued under an expired
        message, its retry time reached, its window open, its workshop and enrollment on.

        The dispatch queues by it; the health page counts by it.
        """
        return (
            (
                models.Q(status=cls.Status.PENDING)
                | models.Q(status=cls.Status.QUEUED, queued_until__lte=now)
            )
            & (models.Q(next_attempt_at__isnull=True) | models.Q(next_attempt_at__lte=now))
            & policy.open_start_q(now, through="workshop__")
            & models.Q(
                workshop__status=Workshop.Status.SCHEDULED,
                enrollment__status=Enrollment.Status.ACTIVE,
            )
        )

    # Never stored: both follow the workshop's start as it is now (ReminderPolicy).
    @property
    def window_opens_at(self):
        return ReminderPolicy.from_settings().window_opens_at(self.workshop.starts_at)

    @property
    def deadline_at(self):
        return ReminderPolicy.from_settings().deadline_at(self.workshop.starts_at)


class MessageText(models.Model):
    """The language, subject and intro a reminder was frozen with at its first claim (immutable).

    Shared by content (``digest``); a staff edit never changes what is sent under a key.
    """

    class Source(models.TextChoices):
        LANGUAGE = "language", "the workshop's text in this language"
        WORKSHOP = "workshop", "the workshop's own text"
        BUILT_IN = "built_in", "the built-in text"

    digest = models.CharField(max_length=64, unique=True, editable=False)
    language = models.CharField(max_length=8, editable=False)
    subject_source = models.CharField(max_length=16, choices=Source.choices, editable=False)
    subject = models.TextField(editable=False)
    intro_source = models.CharField(max_length=16, choices=Source.choices, editable=False)
    intro = models.TextField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "frozen message text"

    def __str__(self) -> str:
        return f"{self.language}: {self.subject[:60]}"


class DeliveryAttempt(models.Model):
    """One claim of a reminder by a worker, and what became of it (append-only history)."""

    class Outcome(models.TextChoices):
        IN_FLIGHT = "in_flight", "In flight"
        SENT = "sent", "Sent"
        TRANSIENT = "transient", "Transient failure"
        PERMANENT = "permanent", "Permanent failure"
        TIMED_OUT = "timed_out", "Timed out"
        CANCELLED = "cancelled", "Cancelled (worker stopped)"
        NOT_STARTED = "not_started", "Released before the provider call"
        LEASE_EXPIRED = "lease_expired", "Lease expired (worker lost)"
        WITHDRAWN = "withdrawn", "Withdrawn (workshop or enrollment changed before the call)"

    # Indexed by the unique (reminder, number), which leads with it.
    reminder = models.ForeignKey(
        Reminder, on_delete=models.CASCADE, related_name="attempts_log", db_index=False
    )
    number = models.PositiveIntegerField()
    claim_token = models.UUIDField(db_index=True)
    channel = models.CharField(max_length=16)
    worker = models.CharField(max_length=200, blank=True)
    claimed_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.IN_FLIGHT)
    provider_calls = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    provider_message_id = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["reminder", "number"]
        constraints = [
            models.UniqueConstraint(fields=["reminder", "number"], name="attempt_unique_number"),
        ]

    def __str__(self) -> str:
        return f"Attempt {self.number} of reminder {self.reminder_id}: {self.outcome}"


class DeliveryEvent(models.Model):
    """What a provider reported after it accepted a reminder (append-only history).

    The unique (channel, event id) counts a retried webhook once.
    """

    class Kind(models.TextChoices):
        DELIVERED = "delivered", "Delivered"
        DEFERRED = "deferred", "Deferred"
        BOUNCED = "bounced", "Bounced"
        COMPLAINED = "complained", "Complained (marked as spam)"

    class Bounce(models.TextChoices):
        NONE = "", "-"
        HARD = "hard", "Hard"
        SOFT = "soft", "Soft"

    reminder = models.ForeignKey(
        Reminder, on_delete=models.CASCADE, related_name="delivery_events", editable=False
    )
    channel = models.CharField(max_length=16, editable=False)
    event_id = models.CharField(max_length=200, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices, editable=False)
    bounce = models.CharField(max_length=8, choices=Bounce.choices, blank=True, editable=False)
    occurred_at = models.DateTimeField(
        editable=False, help_text="When the provider says it happened."
    )
    received_at = models.DateTimeField(editable=False)
    reason = models.TextField(blank=True, editable=False)
    address_key = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text="The address_key of the address the message went to (a run of soft "
        "bounces is counted per address); blank for reports kept before it was recorded.",
    )

    class Meta:
        ordering = ["reminder", "occurred_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "event_id"], name="delivery_event_once_per_provider_event"
            ),
        ]
        indexes = [
            models.Index(fields=["reminder", "-occurred_at"], name="delivery_event_latest"),
            # Each scan's prune looks for reports past the retention.
            models.Index(fields=["received_at"], name="delivery_event_received"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} for reminder {self.reminder_id} at {self.occurred_at:%Y-%m-%d %H:%M:%S} UTC"


class DroppedReports(models.Model):
    """How many provider reports named no reminder here (or an erased attendee's), per channel."""

    channel = models.CharField(max_length=16, unique=True, editable=False)
    count = models.PositiveBigIntegerField(default=0, editable=False)

    def __str__(self) -> str:
        return f"{self.count} reports dropped on {self.channel}"


class Suppression(models.Model):
    """An address no reminder goes to: it bounced hard, or its owner marked a reminder as spam.

    Matched by ``address_key`` (feedback.address_key), so an erased attendee's address stays
    suppressed with ``address`` blanked. A lifted row stays as history.
    """

    class Cause(models.TextChoices):
        BOUNCED = "bounced", "Bounced"
        COMPLAINED = "complained", "Complained (marked as spam)"

    address_key = models.CharField(max_length=64, editable=False)
    address = models.EmailField(max_length=254, blank=True, editable=False)
    cause = models.CharField(max_length=16, choices=Cause.choices, editable=False)
    caused_at = models.DateTimeField(
        editable=False, help_text="When the provider says it happened."
    )
    event = models.ForeignKey(
        DeliveryEvent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        editable=False,
    )  # fmt: skip
    created_at = models.DateTimeField(editable=False)
    lifted_at = models.DateTimeField(null=True, blank=True, editable=False)
    lift_decision = models.ForeignKey(
        "StaffDecision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        editable=False,
    )  # fmt: skip

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["address_key"],
                condition=models.Q(lifted_at__isnull=True),
                name="suppression_one_live_row_per_address",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.address or 'erased address'}: {self.get_cause_display()}"

    @property
    def refusal(self) -> str:
        """The reason a reminder to this address ends ``failed`` without a call."""
        return f"suppressed: {self.cause} on {self.caused_at:%Y-%m-%d}"


class StaffDecision(models.Model):
    """One staff decision, written in the transaction that makes the change (append-only)."""

    class Action(models.TextChoices):
        REPLAY = "replay", "Replay"
        MARK_SENT = "mark_sent", "Unknown outcome resolved: marked as sent"
        SEND_AGAIN = "send_again", "Unknown outcome resolved: sent again"
        CANCEL = "cancel", "Workshops cancelled"
        REINSTATE = "reinstate", "Workshops reinstated"
        CANCEL_ENROLLMENTS = "cancel_enrol", "Enrollments cancelled"
        ERASE = "erase", "Attendee's personal data erased"
        SEND_TEST = "send_test", "Test reminder sent to the staff member"
        LIFT_SUPPRESSION = "lift_suppress", "Suppressed addresses lifted"
        SILENCE_NOTICES = "silence", "Change not notified"

    class State(models.TextChoices):
        DONE = "done", "Done"
        RUNNING = "running", "Running in the background"

    action = models.CharField(max_length=16, choices=Action.choices, editable=False)
    state = models.CharField(
        max_length=8, choices=State.choices, default=State.DONE, editable=False
    )
    progress = models.PositiveIntegerField(
        default=0, editable=False, help_text="Reminders of a background replay processed so far."
    )
    heartbeat_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When a worker last moved a background replay on (the database's clock); "
        "the scan hands one that stalled to a worker again.",
    )
    selection_ids = models.JSONField(
        default=list,
        editable=False,
        help_text="The reminders a background replay works through, emptied when it is done.",
    )
    request_token = models.CharField(
        max_length=32,
        null=True,
        blank=True,
        unique=True,
        editable=False,
        help_text="The one-time token of the form that asked for it: a form posted twice "
        "records one decision.",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    actor_name = models.CharField(
        max_length=150, editable=False, help_text="The actor's username at the time."
    )
    created_at = models.DateTimeField(editable=False)
    reason = models.TextField(blank=True, editable=False)
    selected = models.PositiveIntegerField(
        editable=False, help_text="Reminders (or workshops) in the selection."
    )
    changed = models.PositiveIntegerField(
        editable=False, help_text="Reminders (or workshops) the decision changed."
    )
    queued = models.PositiveIntegerField(
        default=0, editable=False, help_text="Reminders queued for delivery after commit."
    )
    skipped = models.JSONField(
        default=dict, editable=False, help_text="Left alone, counted by reason."
    )
    reminder_ids = models.JSONField(
        default=list, editable=False, help_text="Ids of the reminders changed."
    )
    workshop_ids = models.JSONField(
        default=list, editable=False, help_text="Ids of the workshops cancelled or reinstated."
    )
    attendee_ids = models.JSONField(
        default=list, editable=False, help_text="Ids of the attendees whose data was erased."
    )
    enrollment_ids = models.JSONField(
        default=list, editable=False, help_text="Ids of the enrollments cancelled."
    )
    outcome = models.TextField(
        blank=True,
        editable=False,
        help_text="How a test send ended: sent with the provider's id, or why not.",
    )
    tests_notice = models.BooleanField(
        "a test of the change notice",
        default=False,
        db_default=False,
        editable=False,
        help_text="A test send of the attendee's change notice, not of their reminder.",
    )
    use_edited_text = models.BooleanField(
        "replayed with the edited text",
        default=False,
        editable=False,
        help_text="A replay whose reminders drop the text they were frozen with and take the "
        "workshop's text as it is at their next claim.",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "staff decision"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(
                    action__in=[
                        "replay",
                        "mark_sent",
                        "send_again",
                        "cancel",
                        "reinstate",
                        "erase",
                        "send_test",
                        "cancel_enrol",
                        "lift_suppress",
                        "silence",
                    ]
                ),
                name="staff_decision_action_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_action_display()} by {self.actor_name} at {self.created_at:%Y-%m-%d %H:%M} UTC"

    @classmethod
    def record(cls, *, actor, **fields) -> StaffDecision:
        """Create a decision by ``actor``, named as now (an unsaved user: the name only)."""
        return cls.objects.create(
            actor=actor if actor.pk else None, actor_name=actor.get_username(), **fields
        )


class ScanRun(models.Model):
    """The last completed scan of one kind: when it finished, how long it took, what it did.

    Beat's ``last_run_at`` says when one was published (it can expire unrun).
    """

    name = models.CharField(max_length=64, unique=True, editable=False)
    finished_at = models.DateTimeField(editable=False)
    duration_seconds = models.FloatField(editable=False)
    counts = models.JSONField(default=dict, editable=False)
    phase_seconds = models.JSONField(
        default=dict, editable=False, help_text="How long each phase of the scan took."
    )
    worker = models.CharField(max_length=200, blank=True, editable=False)
    completed = models.PositiveBigIntegerField(
        default=0, editable=False, help_text="Scans completed since the row was created."
    )

    def __str__(self) -> str:
        return f"Scan {self.name} finished at {self.finished_at:%Y-%m-%d %H:%M:%S} UTC"


class Dispatch(models.Model):
    """One batch message the dispatch queued: which reminders, when, and until when (history)."""

    queued_at = models.DateTimeField(db_index=True, editable=False)
    expires_at = models.DateTimeField(
        editable=False, help_text="When the message expires and its rows are due again."
    )
    reminder_ids = models.JSONField(default=list, editable=False)
    publish_failed_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="When the broker refused the message; its rows were made due again then.",
    )  # fmt: skip

    class Meta:
        ordering = ["queued_at", "id"]

    def __str__(self) -> str:
        return f"Dispatch of {len(self.reminder_ids)} reminders at {self.queued_at:%Y-%m-%d %H:%M:%S} UTC"


class WorkshopRevision(models.Model):
    """One numbered state of a workshop's facts that its reminded attendees must hear of.

    Its notices are planned once it settles; a newer revision supersedes its unsent ones.
    """

    workshop = models.ForeignKey(
        Workshop, on_delete=models.CASCADE, related_name="revisions", editable=False
    )
    number = models.PositiveIntegerField(editable=False)
    starts_at = models.DateTimeField(editable=False)
    ends_at = models.DateTimeField(editable=False)
    location = models.CharField(max_length=300, blank=True, editable=False)
    join_url = models.CharField(max_length=500, blank=True, editable=False)
    cancelled = models.BooleanField(default=False, editable=False)
    cancellation_reason = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(editable=False)
    settles_at = models.DateTimeField(
        editable=False, help_text="When its notices are planned, if nothing changes before."
    )
    planned_at = models.DateTimeField(null=True, blank=True, editable=False)
    superseded_at = models.DateTimeField(null=True, blank=True, editable=False)
    silenced_by = models.ForeignKey(
        "StaffDecision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        editable=False, help_text="Staff chose not to notify attendees of this revision.",
    )  # fmt: skip

    class Meta:
        ordering = ["workshop", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["workshop", "number"], name="workshop_revision_unique_number"
            ),
        ]

    def __str__(self) -> str:
        return f"Revision {self.number} of workshop {self.workshop_id}"


class Notice(models.Model):
    """One change notice: tells one reminded attendee what a workshop revision changed.

    At most one per (attendee, workshop, revision): its sent marker. Its status changes only by
    guarded UPDATEs in notices.
    """

    class Kind(models.TextChoices):
        CHANGED = "changed", "Changed (time, place or link)"
        CANCELLED = "cancelled", "Cancelled"
        REINSTATED = "reinstated", "Back on"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending (claimed by a worker)"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"
        MISSED = "missed", "Missed (the workshop started)"
        UNKNOWN = "unknown", "Unknown (may have reached the provider)"
        SUPERSEDED = "superseded", "Superseded by a newer revision"
        SILENCED = "silenced", "Not sent (staff, an unsubscribe or an erasure stopped it)"

    reminder = models.ForeignKey(
        Reminder, on_delete=models.CASCADE, related_name="notices", editable=False
    )
    attendee = models.ForeignKey(
        Attendee, on_delete=models.PROTECT, related_name="notices", editable=False
    )
    workshop = models.ForeignKey(
        Workshop, on_delete=models.PROTECT, related_name="notices", editable=False
    )
    revision = models.ForeignKey(
        WorkshopRevision, on_delete=models.PROTECT, related_name="notices", editable=False
    )
    number = models.PositiveIntegerField(
        editable=False, help_text="The revision's number: the calendar's SEQUENCE."
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, editable=False)
    key = models.CharField(max_length=80, unique=True, editable=False)
    # What the attendee had been told before (the "from" of "from what to what").
    old_starts_at = models.DateTimeField(null=True, blank=True, editable=False)
    old_ends_at = models.DateTimeField(null=True, blank=True, editable=False)
    old_location = models.CharField(max_length=300, blank=True, editable=False)
    old_join_url = models.CharField(max_length=500, blank=True, editable=False)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, editable=False
    )
    status_reason = models.CharField(max_length=200, blank=True, editable=False)
    attempts = models.PositiveIntegerField(default=0, editable=False)
    next_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    queued_until = models.DateTimeField(null=True, blank=True, editable=False)
    maybe_sent = models.BooleanField(default=False, editable=False)
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    channel = models.CharField(max_length=16, blank=True, editable=False)
    provider_message_id = models.CharField(max_length=255, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    sent_to = models.EmailField(
        max_length=254,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text="The address its last claim's message went to (as a reminder's).",
    )
    text = models.ForeignKey(
        MessageText, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        editable=False, help_text="The language and intro frozen at the first claim.",
    )  # fmt: skip
    created_at = models.DateTimeField(editable=False)
    updated_at = models.DateTimeField(editable=False)

    class Meta:
        ordering = ["workshop", "number", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["attendee", "workshop", "number"], name="notice_once_per_revision"
            ),
            models.CheckConstraint(
                condition=models.Q(
                    status="sending", claim_token__isnull=False, lease_expires_at__isnull=False
                )
                | (~models.Q(status="sending") & models.Q(claim_token__isnull=True)),
                name="notice_claimed_while_sending",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notice_open",
                condition=models.Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return f"Notice {self.key} ({self.status})"
