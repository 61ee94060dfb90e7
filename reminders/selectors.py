"""Reads for the staff pages; uncached, so they never claim beat is alive when it is not.

The send path never imports this module: delivery decides by guarded UPDATEs, never earlier reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections
from django.db.models import BooleanField, Count, Exists, F, Func, OuterRef, Q, QuerySet, Subquery

from clock import Clock, default_clock
from reminders.content import choose_text, language_name, reminder_language
from reminders.models import DeliveryEvent, Notice, Reminder, ScanRun, WorkshopRevision
from reminders.policy import ReminderPolicy
from reminders.schedule import SCAN_NAME, SCAN_TASK_NAME
from workshops.models import Enrollment, Workshop

Status = Reminder.Status

# A scan older than this many intervals means beat is not running (FAULTS T8).
STALE_AFTER_INTERVALS = 3
# celery.beat.Scheduler.sync_every: unless CELERY_BEAT_SYNC_EVERY is 1, the stored
# last_run_at may lag a healthy beat by this much.
BEAT_SYNC_SECONDS = 3 * 60

REPLAYABLE_STATUSES = (Status.FAILED, Status.MISSED)

# Why a selected reminder is left alone, in the order staff read them.
SKIP_REASONS = {
    "sent": "already sent",
    "past_cutoff": "past the cutoff",
    "cancelled": "cancelled",
    "unknown": "outcome unknown (resolve it instead)",
    "in_progress": "already pending, queued or sending",
    "not_unknown": "not of unknown outcome",
    "unsubscribed": "unsubscribed through it, so it reached them (mark it sent)",
    "not_found": "no longer exist",
    "raced": "changed meanwhile by another staff member or a worker",
}


class _AmongIds(Func):
    """``pk = ANY(ARRAY(subquery))``: the subquery runs once, then each id is a primary-key probe.

    ``pk IN (subquery)`` becomes a join of the table with itself, which statistics taken while
    the table was nearly empty plan as nested loops reading it once per row.
    """

    output_field = BooleanField()

    def as_sql(self, compiler, connection, **extra):
        (pk, pk_params), (ids, ids_params) = map(compiler.compile, self.get_source_expressions())
        return f"{pk} = ANY(ARRAY{ids})", [*pk_params, *ids_params]


def selection_of(rows: QuerySet) -> QuerySet:
    """Return the selection as a plain filter on its model's key, fit for a lock or UPDATE."""
    ids = rows.order_by().values("pk")
    if connections[rows.db].vendor != "postgresql":
        return rows.model.objects.filter(pk__in=ids)
    return rows.model.objects.filter(_AmongIds(F("pk"), Subquery(ids)))


def on_time_now_q(now: datetime) -> Q:
    """Return "before the deadline", judged on the workshop's start as it is now."""
    return ~ReminderPolicy.from_settings().late_start_q(now, through="workshop__")


# The attendee used the unsubscribe link of a message about the workshop: it reached them.
UNSUBSCRIBED = Q(unsubscribed_at__isnull=False)

# The workshop is on and the attendee still enrolled; its negation is "called off".
_GOING_AHEAD = Q(
    workshop__status=Workshop.Status.SCHEDULED, enrollment__status=Enrollment.Status.ACTIVE
)


def sendable_q(now: datetime) -> Q:
    """Return the rule for "may still be sent": before the deadline, workshop and enrollment on."""
    return on_time_now_q(now) & _GOING_AHEAD


@dataclass(frozen=True, slots=True)
class SelectionPreview:
    """What a replay or a resolution would do to a selection, before it runs."""

    selected: int
    eligible: int
    skipped: dict[str, int] = field(default_factory=dict)


def _selection_preview(
    reminders: QuerySet[Reminder], eligible: Q, **skipped: Q
) -> SelectionPreview:
    """Count, in one query, the selection, its eligible rows and those skipped for each reason."""
    counts = selection_of(reminders).aggregate(
        selected=Count("pk"),
        eligible=Count("pk", filter=eligible),
        **{reason: Count("pk", filter=rule) for reason, rule in skipped.items()},
    )
    selected, eligible = counts.pop("selected"), counts.pop("eligible")
    skipped = {reason: count for reason, count in counts.items() if count}
    return SelectionPreview(selected, eligible, skipped)


def reminder_replay_preview(
    *, reminders: QuerySet[Reminder], clock: Clock | None = None
) -> SelectionPreview:
    """Count the reminders a replay would re-arm, and why it skips the rest."""
    now = (clock or default_clock()).now()
    replayable = Q(status__in=REPLAYABLE_STATUSES)
    return _selection_preview(
        reminders,
        replayable & sendable_q(now),
        sent=Q(status=Status.SENT),
        past_cutoff=replayable & ~on_time_now_q(now),
        cancelled=Q(status=Status.CANCELLED) | (replayable & on_time_now_q(now) & ~_GOING_AHEAD),
        unknown=Q(status=Status.UNKNOWN),
        in_progress=Q(status__in=(Status.PENDING, Status.QUEUED, Status.SENDING)),
    )


def reminder_resolve_preview(
    *, reminders: QuerySet[Reminder], send_again: bool, clock: Clock | None = None
) -> SelectionPreview:
    """Count the unknown reminders resolvable as asked (only sendable ones can be sent again)."""
    unknown = Q(status=Status.UNKNOWN)
    if not send_again:
        return _selection_preview(reminders, unknown, not_unknown=~unknown)
    now = (clock or default_clock()).now()
    return _selection_preview(
        reminders,
        unknown & sendable_q(now) & ~UNSUBSCRIBED,
        not_unknown=~unknown,
        past_cutoff=unknown & ~on_time_now_q(now),
        cancelled=unknown & on_time_now_q(now) & ~_GOING_AHEAD,
        unsubscribed=unknown & sendable_q(now) & UNSUBSCRIBED,
    )


@dataclass(frozen=True, slots=True)
class SchedulerHealth:
    """What staff need to see whether beat and the workers are doing their job (FAULTS T8)."""

    now: datetime
    interval: timedelta
    stale_after: timedelta
    #: When beat last *published* a scan (django-celery-beat's last_run_at).
    last_scan_at: datetime | None
    #: When a worker last *finished* one (reminders.models.ScanRun).
    last_completed_at: datetime | None
    last_completed_counts: dict
    last_completed_seconds: float | None
    scan_registered: bool
    scan_enabled: bool
    due_now: int
    queued: int
    sending: int
    lease_expired: int
    failed: int
    unknown: int

    @property
    def last_scan_age(self) -> timedelta | None:
        return None if self.last_scan_at is None else self.now - self.last_scan_at

    @property
    def is_stale(self) -> bool:
        """Return True when beat has not started a scan for longer than ``stale_after``."""
        age = self.last_scan_age
        return not self.scan_enabled or age is None or age > self.stale_after

    @property
    def last_completed_age(self) -> timedelta | None:
        return None if self.last_completed_at is None else self.now - self.last_completed_at

    @property
    def scans_stalled(self) -> bool:
        """Return True when no scan has finished for longer than ``stale_after``."""
        age = self.last_completed_age
        return age is None or age > self.stale_after

    @property
    def warning(self) -> str:
        """Return what is wrong with the scheduler and what to do, or "" when it is healthy."""
        if not self.scan_registered:
            return (
                f"The periodic scan ({SCAN_TASK_NAME!r}) is not registered: run "
                "`manage.py migrate`, then start celery beat. No reminder is being sent."
            )
        if not self.scan_enabled:
            return (
                f"The periodic scan ({SCAN_TASK_NAME!r}) is disabled in Periodic tasks; "
                "restart celery beat to enable it again. No new reminder is being queued."
            )
        if self.last_scan_at is None:
            return (
                "Celery beat has never started a scan: start exactly one `celery -A config "
                "beat`. No new reminder is being queued."
            )
        if self.is_stale:
            minutes = int(self.last_scan_age.total_seconds() // 60)
            return (
                f"The last scan started {minutes} minutes ago, more than "
                f"{STALE_AFTER_INTERVALS} scan intervals: celery beat is down. Start exactly "
                "one `celery -A config beat`; due reminders wait until it runs."
            )
        if self.last_completed_at is None:
            return (
                "Celery beat publishes scans but no scan has finished yet: start a worker "
                "(`celery -A config worker`). No new reminder is being queued."
            )
        if self.scans_stalled:
            minutes = int(self.last_completed_age.total_seconds() // 60)
            return (
                f"Celery beat publishes scans but none has finished for {minutes} minutes: are "
                "the workers running and reaching the database and the broker? Due reminders "
                "are not being queued or reaped."
            )
        return ""


def stale_after() -> timedelta:
    """Return how old the stored last scan may be before beat counts as down."""
    lag = 0 if getattr(settings, "CELERY_BEAT_SYNC_EVERY", 0) == 1 else BEAT_SYNC_SECONDS
    return timedelta(seconds=STALE_AFTER_INTERVALS * settings.REMINDERS_SCAN_INTERVAL + lag)


def scheduler_health(*, clock: Clock | None = None) -> SchedulerHealth:
    """Read beat's last publish, the last completed scan and the counts by state (three queries)."""
    from django_celery_beat.models import PeriodicTask

    now = (clock or default_clock()).now()
    scan = PeriodicTask.objects.filter(name=SCAN_TASK_NAME).values("last_run_at", "enabled").first()
    done = (
        ScanRun.objects.filter(name=SCAN_NAME)
        .values("finished_at", "counts", "duration_seconds")
        .first()
    )
    counts = Reminder.objects.filter(
        status__in=(Status.PENDING, Status.QUEUED, Status.SENDING, Status.FAILED, Status.UNKNOWN)
    ).aggregate(
        due_now=Count("pk", filter=Reminder.due_q(now, ReminderPolicy.from_settings())),
        queued=Count("pk", filter=Q(status=Status.QUEUED)),
        sending=Count("pk", filter=Q(status=Status.SENDING)),
        lease_expired=Count("pk", filter=Q(status=Status.SENDING, lease_expires_at__lte=now)),
        failed=Count("pk", filter=Q(status=Status.FAILED)),
        unknown=Count("pk", filter=Q(status=Status.UNKNOWN)),
    )
    return SchedulerHealth(
        now=now,
        interval=timedelta(seconds=settings.REMINDERS_SCAN_INTERVAL),
        stale_after=stale_after(),
        last_scan_at=scan["last_run_at"] if scan else None,
        last_completed_at=done["finished_at"] if done else None,
        last_completed_counts=done["counts"] if done else {},
        last_completed_seconds=done["duration_seconds"] if done else None,
        scan_registered=scan is not None,
        scan_enabled=bool(scan and scan["enabled"]),
        **counts,
    )


@dataclass(frozen=True, slots=True)
class TextReach:
    """Which text the attendees of one language get, and how many reminders an edit reaches."""

    language_name: str
    attendees: int
    unclaimed: int
    subject_source: str
    intro_source: str


def workshop_text_reach(workshop: Workshop) -> tuple[list[TextReach], int, int]:
    """Return the text each language's attendees get, and how many reminders an edit reaches
    (unclaimed) and not (frozen)."""

    def by_language(rows) -> Counter:
        counted = Counter()
        for language, count in rows.values_list("attendee__language").annotate(count=Count("pk")):
            counted[reminder_language(workshop=workshop, attendee=_Speaker(language))] += count
        return counted

    texts = {text.language: text for text in workshop.texts.all()}
    mine = Reminder.objects.filter(workshop=workshop)
    attendees = by_language(
        Enrollment.objects.filter(workshop=workshop, status=Enrollment.Status.ACTIVE)
    )
    unclaimed = by_language(mine.filter(text__isnull=True, status__in=Reminder.OPEN_STATUSES))
    rows = []
    for language in sorted(set(attendees) | set(unclaimed)):
        chosen = choose_text(workshop=workshop, attendee=_Speaker(language), texts=texts)
        rows.append(
            TextReach(
                language_name=language_name(language),
                attendees=attendees[language],
                unclaimed=unclaimed[language],
                subject_source=chosen.get_subject_source_display(),
                intro_source=chosen.get_intro_source_display(),
            )
        )
    frozen = mine.filter(text__isnull=False).count()
    return rows, sum(unclaimed.values()), frozen


@dataclass(frozen=True, slots=True)
class _Speaker:
    """Stands in for an attendee of a language when choosing a text."""

    language: str


# What the provider reported last, as "kind" or "kind:bounce" (delivered, bounced:hard...).
DELIVERY_STATES = {
    "delivered": "Delivered",
    "deferred": "Deferred",
    "bounced:hard": "Bounced (hard)",
    "bounced:soft": "Bounced (soft)",
    "complained": "Complained",
}


def with_delivery_state(reminders: QuerySet[Reminder]) -> QuerySet[Reminder]:
    """Annotate ``delivery_kind``, ``delivery_bounce`` and ``delivery_at`` of the latest report."""
    latest = DeliveryEvent.objects.filter(reminder=OuterRef("pk")).order_by("-occurred_at", "-id")
    return reminders.annotate(
        delivery_kind=Subquery(latest.values("kind")[:1]),
        delivery_bounce=Subquery(latest.values("bounce")[:1]),
        delivery_at=Subquery(latest.values("occurred_at")[:1]),
    )


def delivery_state_q(state: str) -> Q:
    """Filter reminders on their latest report's DELIVERY_STATES, or "none" (no report).

    The reports of that state with none later: a join the planner sizes, not a subquery per
    reminder.
    """
    if state == "none":
        return ~Q(Exists(DeliveryEvent.objects.filter(reminder=OuterRef("pk"))))
    kind, _, bounce = state.partition(":")
    later = DeliveryEvent.objects.filter(
        Q(occurred_at__gt=OuterRef("occurred_at"))
        | Q(occurred_at=OuterRef("occurred_at"), id__gt=OuterRef("id")),
        reminder=OuterRef("reminder"),
    )
    latest = DeliveryEvent.objects.filter(~Exists(later), kind=kind, bounce=bounce)
    return Q(pk__in=latest.values("reminder"))


@dataclass(frozen=True, slots=True)
class RevisionRow:
    """One revision of a workshop, as its page lists it: what it says and its notices."""

    revision: WorkshopRevision
    state: str
    counts: dict[str, int]


def workshop_notice_revisions(workshop: Workshop) -> list[RevisionRow]:
    """Return the workshop's revisions, newest first, with their notices counted by status."""
    revisions = list(WorkshopRevision.objects.filter(workshop=workshop).order_by("-number"))
    counts: dict[int, dict[str, int]] = {}
    for revision_id, status, n in (
        Notice.objects.filter(workshop=workshop)
        .order_by()
        .values_list("revision_id", "status")
        .annotate(n=Count("id"))
    ):
        counts.setdefault(revision_id, {})[status] = n
    rows = []
    for revision in revisions:
        if revision.superseded_at is not None:
            state = "superseded before it settled"
        elif revision.planned_at is None:
            state = f"settling until {revision.settles_at:%Y-%m-%d %H:%M:%S} UTC"
        else:
            state = f"planned at {revision.planned_at:%Y-%m-%d %H:%M:%S} UTC"
        if revision.silenced_by_id is not None:
            state += "; staff chose not to notify"
        rows.append(RevisionRow(revision, state, counts.get(revision.pk, {})))
    return rows
