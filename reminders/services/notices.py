"""Change notices: a reminded attendee hears when their workshop changes, once per revision.

The scan compares what each attendee was last told (``Reminder.told_*``) with the workshop and
enrollment now, so a change made anywhere is found. ``notices_revise`` numbers a revision
(edits within REMINDERS_NOTICE_SETTLE fold into one), ``notices_plan`` makes its notices,
``notices_settle`` closes what can no longer be sent and ``notices_dispatch`` publishes the
rest; a worker claims (``notice_claim``), sends and records (``notice_record``) them.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Prefetch, Q, Subquery

from clock import Clock, default_clock
from delivery.redact import redact_text
from delivery.results import DeliveryResult, Outcome
from reminders.content import choose_notice_text
from reminders.models import MessageText, Notice, Reminder, WorkshopRevision, notice_key
from reminders.services._sql import database_now, update_returning
from reminders.services.personal import erased_among, personal_words, scrubber
from reminders.services.record import channel_honours_keys, maybe_sent_reason, retry_delay
from workshops.models import Attendee, Enrollment, Workshop

logger = logging.getLogger(__name__)

Status = Notice.Status
Kind = Notice.Kind
# Reminders whose attendee was (or may have been) told the facts they carried.
TOLD = (Reminder.Status.SENT, Reminder.Status.UNKNOWN)
# The workshop's columns a notice tells: ``told_<name>`` on a reminder, ``<name>`` on a revision.
FACT_FIELDS = ("starts_at", "ends_at", "location", "join_url")

STARTED = "the workshop started before the notice could be sent"
SILENCED = "staff chose not to notify"
LEASE_LOST = "worker lost during the send (lease expired); the provider may have accepted it"
ERASED = "the attendee was erased"
UNSUBSCRIBED = "the attendee unsubscribed"
HEARD = "the attendee holds the workshop's facts as they are now"


@dataclass(frozen=True, slots=True)
class Facts:
    """What a notice tells of a workshop: a change to any of it is news."""

    values: tuple  # FACT_FIELDS, in order
    cancelled: bool

    @classmethod
    def of_workshop(cls, workshop: Workshop) -> Facts:
        values = tuple(getattr(workshop, name) for name in FACT_FIELDS)
        return cls(values, workshop.status == Workshop.Status.CANCELLED)

    @classmethod
    def of_revision(cls, revision: WorkshopRevision) -> Facts:
        return cls(tuple(getattr(revision, name) for name in FACT_FIELDS), revision.cancelled)

    def columns(self, prefix: str = "") -> dict:
        """The facts as column values, each name under ``prefix`` (``told_`` on a reminder)."""
        return {
            f"{prefix}{name}": value for name, value in zip(FACT_FIELDS, self.values, strict=True)
        }


def settle_delay(*, now: datetime, starts_at: datetime) -> timedelta:
    """Return the wait for more edits: REMINDERS_NOTICE_SETTLE, at most a quarter of time left."""
    left = max(timedelta(0), starts_at - now)
    return min(timedelta(seconds=settings.REMINDERS_NOTICE_SETTLE), left / 4)


def _cancelled_now(enrollment: str = "enrollment") -> Q:
    """Cancelled now: the workshop, or the attendee's ``enrollment`` (a path from the row)."""
    return Q(workshop__status=Workshop.Status.CANCELLED) | Q(
        **{f"{enrollment}__status": Enrollment.Status.CANCELLED}
    )


def _same_facts(prefix: str, ref=F) -> Q:
    """Each told fact (``<prefix><name>``) equals the workshop's as it is now."""
    return Q(**{f"{prefix}{name}": ref(f"workshop__{name}") for name in FACT_FIELDS})


_CANCELLED_NOW = _cancelled_now()
_SAME_FACTS = _same_facts("told_")


def _differs(cancelled_now: Q) -> Q:
    """What the attendee was last told differs from now (a cancelled workshop that moves is no
    news)."""
    return (cancelled_now & Q(told_cancelled=False)) | (
        ~cancelled_now & (Q(told_cancelled=True) | ~_SAME_FACTS)
    )


_DIFFERS = _differs(_CANCELLED_NOW)


def _covered(*, cancelled: bool) -> Exists:
    """A notice of the matching kind, not superseded, already tells the facts now.

    Only one of a revision after the attendee's last: an older one told them facts they have
    heard changed since (cancelled, back on, cancelled again).
    """
    notices = Notice.objects.filter(
        _same_facts("revision__", OuterRef),
        reminder=OuterRef("pk"),
        number__gt=OuterRef("told_revision"),
    ).exclude(status=Status.SUPERSEDED)
    if cancelled:
        return Exists(notices.filter(kind=Kind.CANCELLED))
    return Exists(notices.exclude(kind=Kind.CANCELLED))


def _needing_notice() -> Q:
    """Reminders whose attendee must hear of the workshop as it is now and has no notice for it."""
    uncovered = (_CANCELLED_NOW & ~_covered(cancelled=True)) | (
        ~_CANCELLED_NOW & ~_covered(cancelled=False)
    )
    return _DIFFERS & uncovered


def _told(now: datetime):
    """Reminders told something of a workshop not started, attendee neither unsubscribed nor
    erased."""
    return Reminder.objects.filter(
        status__in=TOLD,
        workshop__starts_at__gt=now,
        unsubscribed_at__isnull=True,
        attendee__erased_at__isnull=True,
    )


def _differing_workshops(now: datetime) -> set[int]:
    """Return the workshops where some told attendee's state differs from what they were told.

    Two cheap reads find candidates (a superset); the full test joins four more tables, so it
    runs on their workshops only (docs/scaling.md, the fifth wall).
    """
    told = Reminder.objects.filter(status__in=TOLD, workshop__starts_at__gt=now).order_by()
    by_workshop = told.filter(_differs(Q(workshop__status=Workshop.Status.CANCELLED)))
    by_enrollment = told.filter(
        enrollment__status=Enrollment.Status.CANCELLED, told_cancelled=False
    )
    candidates = {
        *by_workshop.values_list("workshop_id", flat=True).distinct(),
        *by_enrollment.values_list("workshop_id", flat=True).distinct(),
    }
    if not candidates:
        return set()
    differing = _told(now).filter(_needing_notice(), workshop_id__in=candidates).order_by()
    return set(differing.values_list("workshop_id", flat=True).distinct())


def notices_revise(*, clock: Clock | None = None) -> int:
    """Number a revision per workshop whose facts a reminded attendee lacks; return how many."""
    now = database_now(clock or default_clock())
    settling = WorkshopRevision.objects.filter(
        planned_at__isnull=True, superseded_at__isnull=True, workshop__starts_at__gt=now
    ).values_list("workshop_id", flat=True)
    candidates = sorted(_differing_workshops(now) | set(settling))
    return sum(_revise(workshop_id, now=now) for workshop_id in candidates)


def _revise(workshop_id: int, *, now: datetime) -> bool:
    with transaction.atomic():
        # FOR NO KEY UPDATE, as the staff decisions take it: one of them or this at a time.
        workshop = Workshop.objects.select_for_update(no_key=True).filter(pk=workshop_id).first()
        if workshop is None or workshop.starts_at <= now:
            return False
        current = Facts.of_workshop(workshop)
        latest = WorkshopRevision.objects.filter(workshop=workshop).order_by("-number").first()
        delay = settle_delay(now=now, starts_at=workshop.starts_at)
        if latest is not None and latest.planned_at is None and latest.superseded_at is None:
            if Facts.of_revision(latest) == current:
                return False  # settling, with the facts as they are
            # Edited again while settling: one notice of the final facts when the first wait ends.
            settles_at = min(latest.settles_at, now + delay)
        else:
            needing = _told(now).filter(_needing_notice(), workshop=workshop)
            if not needing.exists():
                return False
            settles_at = now + delay
        number = latest.number + 1 if latest is not None else 1
        WorkshopRevision.objects.create(
            workshop=workshop,
            number=number,
            **current.columns(),
            cancelled=current.cancelled,
            cancellation_reason=workshop.cancellation_reason if current.cancelled else "",
            created_at=now,
            settles_at=settles_at,
        )
        WorkshopRevision.objects.filter(
            workshop=workshop,
            number__lt=number,
            planned_at__isnull=True,
            superseded_at__isnull=True,
        ).update(superseded_at=now)
        unsent = Notice.objects.filter(workshop=workshop, number__lt=number, status=Status.PENDING)
        for notice in unsent.filter(maybe_sent=True).select_related("revision"):
            _mark_told(notice)  # it may have arrived: this revision tells them from there
        superseded = unsent.update(
            status=Status.SUPERSEDED,
            status_reason=f"superseded by revision {number}",
            updated_at=now,
        )
    logger.info(
        "Workshop %s: revision %s, notices planned from %s (%s unsent notices superseded)",
        workshop_id,
        number,
        settles_at.isoformat(),
        superseded,
    )
    return True


def notices_plan(*, clock: Clock | None = None) -> int:
    """Plan the notices of every revision that settled; return how many were created."""
    now = database_now(clock or default_clock())
    due = WorkshopRevision.objects.filter(
        planned_at__isnull=True, superseded_at__isnull=True, settles_at__lte=now
    ).values_list("pk", "workshop_id")
    return sum(_plan(pk, workshop_id, now=now) for pk, workshop_id in due)


def _plan(revision_id: int, workshop_id: int, *, now: datetime) -> int:
    with transaction.atomic():
        workshop = Workshop.objects.select_for_update(no_key=True).filter(pk=workshop_id).first()
        revision = WorkshopRevision.objects.filter(
            pk=revision_id, planned_at__isnull=True, superseded_at__isnull=True
        ).first()
        if workshop is None or revision is None:
            return 0
        if Facts.of_revision(revision) != Facts.of_workshop(workshop):
            if workshop.starts_at <= now:  # no revise follows a started workshop
                WorkshopRevision.objects.filter(pk=revision.pk).update(superseded_at=now)
            return 0  # changed since: the next revise supersedes it
        notices = []
        if workshop.starts_at > now:
            rows = (
                _told(now)
                .filter(_needing_notice(), workshop=workshop, told_revision__lt=revision.number)
                .values_list(
                    "pk", "attendee_id", "enrollment__status", "told_cancelled",
                    *(f"told_{name}" for name in FACT_FIELDS),
                )
            )  # fmt: skip
            silenced = revision.silenced_by_id is not None
            for pk, attendee_id, enrolled, told_cancelled, *old in rows:
                if revision.cancelled or enrolled == Enrollment.Status.CANCELLED:
                    kind = Kind.CANCELLED
                else:
                    kind = Kind.REINSTATED if told_cancelled else Kind.CHANGED
                notices.append(
                    Notice(
                        reminder_id=pk,
                        attendee_id=attendee_id,
                        workshop=workshop,
                        revision=revision,
                        number=revision.number,
                        kind=kind,
                        key=notice_key(
                            attendee_id=attendee_id,
                            workshop_id=workshop.pk,
                            revision=revision.number,
                        ),
                        **{
                            f"old_{name}": value
                            for name, value in zip(FACT_FIELDS, old, strict=True)
                        },
                        status=Status.SILENCED if silenced else Status.PENDING,
                        status_reason=SILENCED if silenced else "",
                        created_at=now,
                        updated_at=now,
                    )
                )
        Notice.objects.bulk_create(notices, ignore_conflicts=True)
        WorkshopRevision.objects.filter(pk=revision.pk).update(planned_at=now)
    if notices:
        logger.info(
            "Workshop %s revision %s: %s notices planned",
            workshop_id,
            revision.number,
            len(notices),
        )
    return len(notices)


def notices_settle(*, clock: Clock | None = None) -> dict[str, int]:
    """Close what can no longer be sent: open notices of a started workshop, lost claims."""
    now = database_now(clock or default_clock())
    counts: Counter[str] = Counter()
    started = Notice.objects.filter(status=Status.PENDING, workshop__starts_at__lte=now)
    for maybe_sent, status in ((False, Status.MISSED), (True, Status.UNKNOWN)):
        counts[f"notices_{status}"] += started.filter(maybe_sent=maybe_sent).update(
            status=status, status_reason=STARTED, queued_until=None, updated_at=now
        )
    lost = Notice.objects.filter(status=Status.SENDING, lease_expires_at__lte=now)
    for notice in lost.select_related("revision", "workshop").order_by():
        lapsed = Notice.objects.filter(
            pk=notice.pk, status=Status.SENDING, claim_token=notice.claim_token
        )
        if channel_honours_keys(notice.channel) and notice.workshop.starts_at > now:
            # Sent again with the same key: the provider drops a second copy.
            counts["notices_reaped"] += lapsed.update(
                status=Status.PENDING, maybe_sent=True, claim_token=None,
                lease_expires_at=None, updated_at=now,
            )  # fmt: skip
            continue
        with transaction.atomic():
            if lapsed.update(
                status=Status.UNKNOWN, status_reason=LEASE_LOST, maybe_sent=True,
                claim_token=None, lease_expires_at=None, updated_at=now,
            ):  # fmt: skip
                counts["notices_reaped"] += 1
                _mark_told(notice)
    return {name: value for name, value in counts.items() if value}


def notices_dispatch(*, publish: Callable[[list[int]], object], clock: Clock | None = None) -> int:
    """Publish the notices that may be sent now, in batches after commit; return how many.

    A notice is published again only after REMINDERS_REQUEUE_AFTER (``queued_until``).
    """
    now = database_now(clock or default_clock())
    due = Notice.objects.filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
        Q(queued_until__isnull=True) | Q(queued_until__lte=now),
        status=Status.PENDING,
        workshop__starts_at__gt=now,
    )
    ids = list(
        due.order_by("workshop__starts_at", "pk").values_list("pk", flat=True)[
            : settings.REMINDERS_DISPATCH_LIMIT
        ]
    )
    if not ids:
        return 0
    size = settings.REMINDERS_BATCH_SIZE
    with transaction.atomic():
        queued = sorted(
            pk
            for pk, _ in update_returning(
                Notice.objects.filter(pk__in=ids, status=Status.PENDING),
                queued_until=now + timedelta(seconds=settings.REMINDERS_REQUEUE_AFTER),
                updated_at=now,
            )
        )
        for start in range(0, len(queued), size):
            transaction.on_commit(partial(_publish, publish, queued[start : start + size]))
    logger.info("Dispatched %s change notices", len(queued))
    return len(queued)


def _publish(publish, ids: list[int]) -> None:
    if publish(ids) is False:
        Notice.objects.filter(pk__in=ids, status=Status.PENDING).update(queued_until=None)


@dataclass(frozen=True, slots=True)
class NoticeClaim:
    """Notices one worker now owns, fenced by ``token``."""

    token: uuid.UUID
    channel: str
    notices: list[Notice]
    # Per notice, the instant on this host's clock after which no call may start.
    send_by: dict[int, datetime] = field(default_factory=dict)


def _live_now() -> Q:
    """Notices still true: their live revision is the workshop now, their kind the attendee's."""
    cancelled = _cancelled_now("reminder__enrollment")
    return (
        Q(revision__superseded_at__isnull=True)
        & _same_facts("revision__")
        & ((Q(kind=Kind.CANCELLED) & cancelled) | (~Q(kind=Kind.CANCELLED) & ~cancelled))
    )


def _lacking() -> Exists:
    """The notice's attendee was last told something other than the workshop as it is now."""
    return Exists(Reminder.objects.filter(_DIFFERS, pk=OuterRef("reminder_id")))


def notice_claim(
    *,
    ids: list[int],
    channel: str,
    clock: Clock | None = None,
    token: uuid.UUID | None = None,
) -> NoticeClaim:
    """Make the calling worker the single owner of those of ``ids`` that may be sent now.

    One guarded UPDATE judges by the database's clock; of two claimers one wins. Notices of a
    started workshop become missed, those of an attendee who unsubscribed silenced, those of one
    who holds the facts as they are now (the change undone) superseded, or counted as told if
    perhaps sent. ``token`` lets a caller release an interrupted claim.
    """
    clock = clock or default_clock()
    host_now = clock.now()
    now = database_now(clock)
    token = token or uuid.uuid4()
    lease = timedelta(seconds=settings.REMINDERS_LEASE_SECONDS)
    taken = [
        pk
        for pk, _ in update_returning(
            Notice.objects.filter(
                _live_now(),
                Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
                _lacking(),
                pk__in=ids,
                status=Status.PENDING,
                workshop__starts_at__gt=now,
                attendee__erased_at__isnull=True,
                reminder__unsubscribed_at__isnull=True,
            ),
            status=Status.SENDING,
            claim_token=token,
            lease_expires_at=now + lease,
            attempts=F("attempts") + 1,
            channel=channel,
            queued_until=None,
            updated_at=now,
            # The address it goes to (its bounce suppresses that one, though corrected later).
            sent_to=Subquery(Attendee.objects.filter(pk=OuterRef("attendee_id")).values("email")),
        )
    ]
    left = Notice.objects.filter(pk__in=[pk for pk in ids if pk not in taken])
    # Back pending after its attendee unsubscribed (a retry, a reaped claim), or planned as
    # they did: silenced as reminder_unsubscribe silences the others.
    left.filter(status=Status.PENDING, reminder__unsubscribed_at__isnull=False).update(
        status=Status.SILENCED, status_reason=UNSUBSCRIBED, queued_until=None, updated_at=now
    )
    # Back pending after its attendee was erased (a call under way failed for a while): the
    # erasure silenced the pending ones; this one is silenced alike, not left to be missed.
    left.filter(status=Status.PENDING, attendee__erased_at__isnull=False).update(
        status=Status.SILENCED, status_reason=ERASED, queued_until=None, updated_at=now
    )
    # Nothing left to tell (the workshop changed back to what they were told): no later
    # revision supersedes it, so it would wait until the start. One perhaps sent stays, its
    # facts taken as told: the next scan's revision supersedes it and tells them it is back.
    left.filter(~_lacking(), status=Status.PENDING, maybe_sent=False).update(
        status=Status.SUPERSEDED, status_reason=HEARD, queued_until=None, updated_at=now
    )
    perhaps_heard = left.filter(~_lacking(), status=Status.PENDING, maybe_sent=True)
    for notice in perhaps_heard.select_related("revision"):
        _mark_told(notice)
    left.filter(
        status=Status.PENDING,
        workshop__starts_at__lte=now,
        maybe_sent=False,
    ).update(status=Status.MISSED, status_reason=STARTED, queued_until=None, updated_at=now)
    notices = list(
        Notice.objects.filter(pk__in=taken, claim_token=token)
        .select_related("attendee", "workshop", "revision", "text", "reminder")
        .order_by("workshop__starts_at", "pk")
    )
    if erased := [n.pk for n in notices if n.attendee.erased_at is not None]:
        # Erased since the UPDATE took them (their address blanked): withdrawn as NoticeWatch
        # withdraws one, the attempt refunded.
        Notice.objects.filter(pk__in=erased, claim_token=token, status=Status.SENDING).update(
            status=Status.SILENCED, status_reason=ERASED, claim_token=None,
            lease_expires_at=None, attempts=F("attempts") - 1, updated_at=now,
        )  # fmt: skip
        notices = [n for n in notices if n.pk not in erased]
    for notice in notices:
        # Written to the address the claim recorded, though corrected since the UPDATE.
        notice.attendee.email = notice.sent_to
    _refresh_old_facts([notice for notice in notices if not notice.maybe_sent])
    _freeze_texts([notice for notice in notices if notice.text_id is None])
    send_by = {n.pk: host_now + (n.workshop.starts_at - now) for n in notices}
    return NoticeClaim(token=token, channel=channel, notices=notices, send_by=send_by)


def notice_release_interrupted(*, token: uuid.UUID, ids: list[int], clock: Clock | None = None):
    """Hand back what an interrupted claim of ``ids`` holds under ``token``; return how many.

    Its statement may commit after the caller reconnected: locking the rows whoever holds them
    waits for it. The attempt is refunded.
    """
    now = (clock or default_clock()).now()
    with transaction.atomic():
        list(Notice.objects.filter(pk__in=ids).order_by("pk").select_for_update(no_key=True))
        return Notice.objects.filter(pk__in=ids, claim_token=token, status=Status.SENDING).update(
            status=Status.PENDING,
            claim_token=None,
            lease_expires_at=None,
            attempts=F("attempts") - 1,
            updated_at=now,
        )


def _refresh_old_facts(notices: list[Notice]) -> None:
    """Take "what they were told" from each attendee's row now: a notice of an earlier revision,
    in flight when this one was planned, may have told them more since (a move, or that it was
    cancelled: then this one says it is back on, in the text of that kind). Only notices no call
    of which may have arrived: one key carries one content."""
    for notice in notices:
        told = {f"old_{name}": getattr(notice.reminder, f"told_{name}") for name in FACT_FIELDS}
        if notice.kind != Kind.CANCELLED:
            kind = Kind.REINSTATED if notice.reminder.told_cancelled else Kind.CHANGED
            if kind != notice.kind:
                told |= {"kind": kind, "text": None}  # chosen again for the kind
        if any(getattr(notice, name) != value for name, value in told.items()):
            Notice.objects.filter(pk=notice.pk, maybe_sent=False).update(**told)
            for name, value in told.items():
                setattr(notice, name, value)


def _freeze_texts(notices: list[Notice]) -> None:
    """Fix the text of notices claimed for the first time: every later send renders from it."""
    if not notices:
        return
    chosen = {
        n.pk: choose_notice_text(workshop=n.workshop, attendee=n.attendee, kind=n.kind)
        for n in notices
    }
    digests = {text.digest: text for text in chosen.values()}
    MessageText.objects.bulk_create(digests.values(), ignore_conflicts=True)
    stored = {text.digest: text for text in MessageText.objects.filter(digest__in=digests)}
    for digest, text in stored.items():
        ids = [pk for pk, choice in chosen.items() if choice.digest == digest]
        Notice.objects.filter(pk__in=ids, text__isnull=True).update(text=text)
    for notice in notices:
        notice.text = stored[chosen[notice.pk].digest]


def notice_record(
    *, claim: NoticeClaim, results: list[DeliveryResult], clock: Clock | None = None
) -> dict[str, int]:
    """Write each outcome, fenced by the claim; return counts by the new status.

    Sent or ``unknown`` moves what the attendee was told to the notice's revision.
    """
    now = database_now(clock or default_clock())
    by_id = {notice.pk: notice for notice in claim.notices}
    counts: Counter[str] = Counter()
    for result in results:
        notice = by_id.get(result.reminder_id)
        if notice is None:
            continue
        values = _verdict(notice=notice, result=result, channel=claim.channel, now=now)
        with transaction.atomic():
            texts = [name for name in ("status_reason", "last_error") if values.get(name)]
            if texts and erased_among([notice.attendee_id]):
                # Erased while this was claimed: the provider's words may quote them.
                attendee = notice.attendee
                scrub = scrubber(personal_words(email=attendee.email, name=attendee.name))
                values |= {name: scrub(values[name]) for name in texts}
            changed = Notice.objects.filter(
                pk=notice.pk, claim_token=claim.token, status=Status.SENDING
            ).update(claim_token=None, lease_expires_at=None, updated_at=now, **values)
            if changed and values["status"] in (Status.SENT, Status.UNKNOWN):
                _mark_told(notice)
        if changed:
            counts[f"notices_{values['status']}"] += 1
    return dict(counts)


def _verdict(*, notice: Notice, result: DeliveryResult, channel: str, now: datetime) -> dict:
    """Return the columns one delivery result writes on its notice (pure)."""
    error = redact_text(result.error)
    if result.outcome == Outcome.SENT:
        return {
            "status": Status.SENT,
            "status_reason": "",
            "sent_at": now,
            "provider_message_id": (result.message_id or "")[:255],
            "last_error": "",
        }
    maybe = result.maybe_delivered or notice.maybe_sent
    if result.maybe_delivered and not channel_honours_keys(channel):
        return _final(Status.UNKNOWN, maybe_sent_reason(result.outcome, channel), error)
    if result.outcome == Outcome.PERMANENT:
        return _final(Status.UNKNOWN if maybe else Status.FAILED, error, error)
    if result.outcome == Outcome.EXPIRED:
        return _final(Status.UNKNOWN if maybe else Status.MISSED, STARTED, error)
    if result.outcome == Outcome.WITHDRAWN:
        # Its attendee was erased before the call (NoticeWatch): nothing more is sent.
        silenced = _final(Status.SILENCED, ERASED, "")
        return {**silenced, "attempts": F("attempts") - 1, "maybe_sent": notice.maybe_sent}
    if not result.provider_reached and result.attempts == 0:
        # Stopped before any call: back as it was, the attempt not counted.
        return {
            "status": Status.PENDING,
            "attempts": F("attempts") - 1,
            "last_error": error,
            "maybe_sent": maybe,
        }
    if notice.attempts >= settings.REMINDERS_MAX_ATTEMPTS:
        reason = f"gave up after {notice.attempts} attempts: {error}"
        return _final(Status.UNKNOWN if maybe else Status.FAILED, reason, error)
    return {
        "status": Status.PENDING,
        "next_attempt_at": now + retry_delay(notice.attempts),
        "last_error": error,
        "maybe_sent": maybe,
    }


def _final(status: str, reason: str, error: str) -> dict:
    return {
        "status": status,
        "status_reason": reason[:200],
        "last_error": error,
        "maybe_sent": status == Status.UNKNOWN,
    }


def _mark_told(notice: Notice) -> None:
    """Record that the attendee now holds the notice's revision (unless a later one already)."""
    Reminder.objects.filter(pk=notice.reminder_id, told_revision__lt=notice.number).update(
        **Facts.of_revision(notice.revision).columns("told_"),
        told_cancelled=notice.kind == Kind.CANCELLED,
        told_revision=notice.number,
    )


def notices_reach(*, workshops) -> dict[int, int]:
    """Return per workshop how many reminded attendees have not heard it as it is now."""
    now = database_now(default_clock())
    return dict(
        _told(now)
        .filter(_needing_notice(), workshop__in=workshops)
        .order_by()
        .values_list("workshop_id")
        .annotate(n=Count("pk"))
    )


def notices_pending(*, workshops) -> dict[int, int]:
    """Return per workshop how many notices of its facts as they are now wait to be sent."""
    pending = dict(
        Notice.objects.filter(
            status=Status.PENDING, workshop__in=workshops, revision__superseded_at__isnull=True
        )
        .order_by()
        .values_list("workshop_id")
        .annotate(n=Count("pk"))
    )
    newest_first = Prefetch("revisions", WorkshopRevision.objects.order_by("-number"))
    for workshop in Workshop.objects.filter(pk__in=list(pending)).prefetch_related(newest_first):
        latest = next(iter(workshop.revisions.all()), None)
        if latest is None or Facts.of_revision(latest) != Facts.of_workshop(workshop):
            del pending[workshop.pk]  # changed again since: notices_reach counts those attendees
    return pending


def notices_told_count(
    *, workshops=None, enrollments=None, cancelled: bool, clock: Clock | None = None
) -> int:
    """Return how many reminded attendees of ``workshops`` would hear of a cancel (or reinstate);
    with ``enrollments`` instead, of a cancel of those (their workshops still scheduled)."""
    now = database_now(clock or default_clock())
    told = _told(now).filter(
        enrollment__status=Enrollment.Status.ACTIVE, told_cancelled=not cancelled
    )
    if enrollments is not None:
        told = told.filter(enrollment__in=enrollments, workshop__status=Workshop.Status.SCHEDULED)
    else:
        told = told.filter(workshop__in=workshops)
    return told.count()


def notices_silence(*, workshop_id: int, decision, clock: Clock | None = None) -> int:
    """Let the attendees of ``workshop_id`` not hear of its current facts (a staff decision).

    The current revision is numbered if need be and marked silenced, with its unsent notices; a
    later change is news again. Return how many attendees this leaves untold.
    """
    now = database_now(clock or default_clock())
    _revise(workshop_id, now=now)
    with transaction.atomic():
        workshop = Workshop.objects.select_for_update(no_key=True).filter(pk=workshop_id).first()
        latest = (
            WorkshopRevision.objects.filter(workshop_id=workshop_id).order_by("-number").first()
        )
        if (
            workshop is None
            or latest is None
            or latest.superseded_at is not None
            or Facts.of_revision(latest) != Facts.of_workshop(workshop)
        ):
            return 0
        silenced = Notice.objects.filter(revision=latest, status=Status.PENDING).update(
            status=Status.SILENCED, status_reason=SILENCED, updated_at=now
        )
        if latest.planned_at is None:
            silenced += _told(now).filter(_needing_notice(), workshop=workshop).count()
        if silenced:  # a workshop with no one to leave untold is not the decision's
            WorkshopRevision.objects.filter(pk=latest.pk).update(silenced_by=decision)
    return silenced


def reminders_owed_notice(*, clock: Clock | None = None):
    """Return reminders whose attendee has not heard the workshop now and has no notice for it."""
    now = database_now(clock or default_clock())
    return _told(now).filter(_needing_notice())
