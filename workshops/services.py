"""Writes to workshops, attendees and enrollments.

Each service validates everything first (``full_clean``), owns its transaction
and announces the change through ``workshops.signals`` inside it, so listeners'
writes are atomic with the change. Nothing is half-saved: a validation error
leaves the database as it was.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from clock import Clock, default_clock
from workshops.models import Attendee, Enrollment, Workshop
from workshops.signals import enrollment_changed, enrollments_added, workshop_changed

# What a reminder shows of its workshop besides its time: where, how to join, who organises.
DETAIL_FIELDS = frozenset({"location", "join_url", "contact_name", "contact_email"})
# What staff write of its reminders: a change reaches only reminders not yet
# claimed (the claim freezes each one's text).
TEXT_FIELDS = frozenset({"language", "reminder_subject", "reminder_intro", "notice_intro"})
RESCHEDULABLE_FIELDS = (
    frozenset({"title", "starts_at", "ends_at", "timezone"}) | DETAIL_FIELDS | TEXT_FIELDS
)


ERASED_NOT_ENROLLED = (
    "This attendee's personal data was erased; to enrol the person again, add them as a new "
    "attendee with their name and email."
)


def workshop_create(
    *,
    title: str,
    starts_at: datetime,
    timezone: str,
    ends_at: datetime | None = None,
    duration: timedelta | None = None,
    clock: Clock | None = None,
    **details: str,
) -> Workshop:
    """Create a scheduled workshop that starts in the future.

    ``details`` are any of DETAIL_FIELDS (location, join_url, contact_name,
    contact_email) and TEXT_FIELDS (language, reminder_subject,
    reminder_intro); each is optional.
    """
    clock = clock or default_clock()
    unknown = set(details) - DETAIL_FIELDS - TEXT_FIELDS
    if unknown:
        raise TypeError(f"workshop_create() got unknown fields {sorted(unknown)}.")
    if ends_at is None and duration is not None and starts_at is not None:
        ends_at = starts_at + duration
    workshop = Workshop(
        title=title, starts_at=starts_at, ends_at=ends_at, timezone=timezone, **details
    )
    workshop.full_clean()
    if workshop.starts_at <= clock.now():
        raise ValidationError(
            {"starts_at": "The start is in the past; give a future start time."}, code="past_start"
        )
    with transaction.atomic():
        workshop.save()
        workshop_changed.send(sender=Workshop, workshop=workshop, changed=frozenset({"created"}))
    return workshop


def workshop_update(*, workshop: Workshop, **changes) -> Workshop:
    """Change a workshop's title, time, zone, details or text; listeners recompute what depends on it.

    A start moved into the past is allowed (the event happened earlier than
    planned); the reminders app then marks unsent reminders as missed.
    """
    unknown = set(changes) - RESCHEDULABLE_FIELDS
    if unknown:
        raise TypeError(
            f"workshop_update() cannot change {sorted(unknown)}; use workshop_cancel() for status."
        )
    with transaction.atomic():
        # FOR NO KEY UPDATE, not FOR UPDATE: a transaction inserting a reminder or
        # an enrollment of this workshop takes FOR KEY SHARE on it at commit (its
        # deferred foreign-key check) and must not wait for this one, which may be
        # waiting for that insert's row (the plan's ON CONFLICT): a deadlock.
        locked = Workshop.objects.select_for_update(no_key=True).get(pk=workshop.pk)
        changed = frozenset(
            name for name, value in changes.items() if getattr(locked, name) != value
        )
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.full_clean()
        if changed:
            locked.save()
            workshop_changed.send(sender=Workshop, workshop=locked, changed=changed)
    return locked


def workshop_cancel(
    *, workshop: Workshop, reason: str = "", clock: Clock | None = None
) -> Workshop:
    """Cancel a workshop, keeping ``reason`` for its attendees; its unsent reminders become
    cancelled in the same transaction."""
    return _set_status(
        workshop, Workshop.Status.SCHEDULED, Workshop.Status.CANCELLED, reason=reason, clock=clock
    )


def workshop_reinstate(*, workshop: Workshop, clock: Clock | None = None) -> Workshop:
    """Bring a cancelled workshop back; listeners re-plan what can still be sent."""
    return _set_status(
        workshop, Workshop.Status.CANCELLED, Workshop.Status.SCHEDULED, reason="", clock=clock
    )


def _set_status(
    workshop: Workshop, old: str, new: str, *, reason: str, clock: Clock | None
) -> Workshop:
    """Move ``workshop`` from ``old`` to ``new`` with a guarded UPDATE and announce it."""
    now = (clock or default_clock()).now()
    with transaction.atomic():
        updated = Workshop.objects.filter(pk=workshop.pk, status=old).update(
            status=new, cancellation_reason=reason, updated_at=now
        )
        workshop.refresh_from_db()
        if updated:
            workshop_changed.send(sender=Workshop, workshop=workshop, changed=frozenset({"status"}))
    return workshop


def attendee_get_or_create(
    *, email: str, name: str, timezone: str = "", language: str = ""
) -> tuple[Attendee, bool]:
    """Return the attendee with this email (case-insensitively), creating it if needed."""
    email = (email or "").strip()
    candidate = Attendee(
        email=email, name=(name or "").strip(), timezone=timezone, language=language
    )
    candidate.full_clean(validate_constraints=False)
    existing = Attendee.objects.filter(email__iexact=email).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            candidate.save()
    except IntegrityError:
        # A concurrent enrolment created the same attendee between our read and
        # write; the case-insensitive unique constraint chose the winner.
        return Attendee.objects.get(email__iexact=email), False
    return candidate, True


def enrollment_create(*, attendee: Attendee, workshop: Workshop) -> Enrollment:
    """Enrol an attendee; re-activate a cancelled enrollment instead of duplicating it.

    Judged from the attendee and workshop read again here, not from the copies passed. Not
    locked: a lock would make a staff change of the workshop wait for every enrolment, and
    the claim and the settle judge the workshop as it is then anyway.
    """
    with transaction.atomic():
        attendee = Attendee.objects.get(pk=attendee.pk)
        workshop = Workshop.objects.get(pk=workshop.pk)
        if not workshop.is_scheduled:
            raise ValidationError(
                {"workshop": "This workshop is cancelled; enrol in a scheduled workshop."},
                code="workshop_cancelled",
            )
        if attendee.erased_at is not None:
            raise ValidationError({"attendee": ERASED_NOT_ENROLLED}, code="attendee_erased")
        enrollment, created = Enrollment.objects.select_for_update(no_key=True).get_or_create(
            attendee=attendee, workshop=workshop
        )
        if not created:
            if enrollment.status == Enrollment.Status.ACTIVE:
                raise ValidationError(
                    {"attendee": "This attendee is already enrolled in this workshop."},
                    code="duplicate_enrollment",
                )
            enrollment.status = Enrollment.Status.ACTIVE
            enrollment.save(update_fields=["status", "updated_at"])
        enrollment_changed.send(sender=Enrollment, enrollment=enrollment, created=created)
    return enrollment


def enrollment_cancel(*, enrollment: Enrollment, clock: Clock | None = None) -> Enrollment:
    """Cancel an enrollment; its unsent reminder becomes cancelled in the same transaction."""
    now = (clock or default_clock()).now()
    with transaction.atomic():
        updated = Enrollment.objects.filter(
            pk=enrollment.pk, status=Enrollment.Status.ACTIVE
        ).update(status=Enrollment.Status.CANCELLED, updated_at=now)
        enrollment.refresh_from_db()
        if updated:
            enrollment_changed.send(sender=Enrollment, enrollment=enrollment, created=False)
    return enrollment


def enrollments_add(*, pairs: list[tuple[int, int]]) -> list[int]:
    """Enrol many (attendee id, workshop id) pairs at once; return the new enrollments' ids.

    The caller has checked each pair (a scheduled workshop, an attendee not
    erased, no enrollment yet) inside its transaction, holding the workshops'
    rows; a pair enrolled meanwhile fails the unique constraint and the whole
    call rolls back. Listeners plan the new enrollments' reminders in it.
    """
    if not pairs:
        return []
    with transaction.atomic():
        made = Enrollment.objects.bulk_create(
            [Enrollment(attendee_id=a, workshop_id=w) for a, w in pairs]
        )
        ids = [enrollment.pk for enrollment in made]
        enrollments_added.send(sender=Enrollment, enrollment_ids=ids)
    return ids
