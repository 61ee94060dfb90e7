"""Enrolments from an integration: attendees upserted, enrolments created, all or nothing.

A request is resolved in full before anything is written, in one transaction:
each item's attendee is validated as the admin validates it, found by the
integration's id for it or by email and locked (``FOR NO KEY UPDATE``: an
erasure either committed first and is seen, or waits), then the workshops are
held (``FOR SHARE``: a cancel waits) and each enrolment checked. One invalid
item refuses the request with every item's reason. A valid one is written in
the order of the emails, and the new enrolments' reminders are planned in the
same transaction (workshops.signals.enrollments_added).

Ids and emails: an attendee is one person with one email (unique, case aside).
An integration's id names one attendee; an attendee has at most one id per
integration. An email that belongs to an attendee holding another id of the
same integration is a conflict, reported, never merged.

Whose details: an integration changes an attendee's email, name, language or
timezone only if the attendee is its own, created through the API by it (its
ref's ``created_attendee``) and known to no other integration (no one else's
ref). Anyone else's attendee it may enrol and give its id: a name, language or
zone that differs from theirs is kept as it is (outcome ``kept``), another
address is refused. Staff change details in the admin, and the admin's CSV
import (``by_staff``) is staff's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Q
from django.db.models.functions import Lower

from delivery.addresses import address_slip, attendee_address_refusal
from intake.models import AttendeeRef, Integration, WorkshopRef
from reminders.locks import lost_a_race
from workshops.models import Attendee, Enrollment, Workshop
from workshops.services import enrollments_add

MAX_ITEMS = 1000
EXTERNAL_ID_LENGTH = 200
# Runs of a request that lost a row to a concurrent one (reminders.locks.lost_a_race).
ATTEMPTS = 5
ATTENDEE_FIELDS = ("name", "language", "timezone")


@dataclass(slots=True)
class AttendeeIn:
    email: str
    name: str | None = None
    language: str | None = None
    timezone: str | None = None
    external_id: str | None = None


@dataclass(slots=True)
class EnrolmentIn:
    attendee: AttendeeIn
    workshop_id: int | None = None
    workshop_external_id: str | None = None


@dataclass(slots=True)
class ItemError:
    index: int
    field: str
    detail: str
    code: str
    # The reason as the CSV import's preview shows it, where ``detail`` speaks of the API's
    # request and items: of the file's rows and columns.
    row_detail: str = ""


class Refused(Exception):
    """The request is refused as a whole; ``errors`` says why, item by item."""

    def __init__(self, errors: list[ItemError], *, conflict: bool = False) -> None:
        super().__init__(f"{len(errors)} errors")
        self.errors = errors
        # True when every reason is the data's state (a cancelled enrolment, an erased
        # attendee, an id taken), not the input's shape: 409 rather than 422.
        self.conflict = conflict


@dataclass(slots=True)
class AttendeeOutcome:
    attendee: Attendee
    outcome: str  # created | updated | unchanged | kept (the details sent were not its to change)


@dataclass(slots=True)
class EnrolmentOutcome:
    index: int
    outcome: str  # created | unchanged
    attendee_id: int
    attendee_outcome: str
    workshop_id: int
    enrolment_id: int


@dataclass(slots=True)
class _Plan:
    keys: dict[str, str]  # each email as given (stripped) -> as the database lowers it
    errors: list[ItemError] = field(default_factory=list)
    conflicts: int = 0
    attendees: dict[str, Attendee] = field(default_factory=dict)  # by key
    outcomes: dict[str, str] = field(default_factory=dict)  # by key
    new_refs: dict[str, str] = field(default_factory=dict)  # external id -> key

    def refuse(
        self, index: int, name: str, detail: str, code: str, *, conflict=False, row_detail=""
    ) -> None:
        self.errors.append(ItemError(index, name, detail, code, row_detail))
        self.conflicts += conflict

    def key(self, email: str) -> str:
        return self.keys[(email or "").strip()]


def _lowered(emails: set[str]) -> dict[str, str]:
    """Each email as the database lowers it: the unique constraint's LOWER(email), which
    differs from Python's str.lower() for some letters (İ), so the two never disagree."""
    if not emails:
        return {}
    ordered = sorted(emails)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT v, LOWER(v) FROM unnest(%s::text[]) AS v", [ordered])
            return dict(cursor.fetchall())
        lowered = {}
        for email in ordered:
            cursor.execute("SELECT LOWER(%s)", [email])
            lowered[email] = cursor.fetchone()[0]
        return lowered


def _validated(index: int, item: AttendeeIn, plan: _Plan, prefix: str) -> Attendee | None:
    """The attendee ``item`` describes, checked as the admin's attendee form checks it."""
    candidate = Attendee(
        email=(item.email or "").strip(),
        name=(item.name or "").strip(),
        language=item.language or "",
        timezone=item.timezone or "",
    )
    exclude = [] if item.name is not None else ["name"]
    errors: dict[str, list[str]] = {}
    try:
        candidate.full_clean(exclude=exclude, validate_constraints=False)
    except ValidationError as error:
        errors = error.message_dict
    if "language" in errors:  # the choices' own message does not say which they are
        codes = ", ".join(code for code, _ in settings.LANGUAGES)
        errors["language"] = [
            f"{candidate.language!r} is not a language reminders are written in: give one of "
            f"{codes}, or leave it blank."
        ]
    if "email" in errors and (slip := address_slip(candidate.email)):
        errors["email"] = [slip]  # what to correct, where Django's says it is not valid
    elif "email" not in errors and (refusal := attendee_address_refusal(candidate.email)):
        errors["email"] = [refusal[0]]
    if item.external_id is not None:
        external = item.external_id.strip()
        if not external:
            errors["external_id"] = ["Give a non-blank id, or leave it out."]
        elif len(external) > EXTERNAL_ID_LENGTH:
            errors["external_id"] = [f"Shorten the id to {EXTERNAL_ID_LENGTH} characters."]
    for name, messages in errors.items():
        for message in messages:
            plan.refuse(index, prefix + name, message, "invalid")
    return None if errors else candidate


def _resolve_attendees(
    integration: Integration,
    items: list[tuple[int, AttendeeIn]],
    plan: _Plan,
    prefix: str,
    *,
    by_staff: bool,
) -> None:
    """Decide each attendee's row and outcome; record each item's reason to refuse it.

    The attendees it finds are locked as they are read, in id order, so what is
    decided holds until the caller commits; so do their refs, read after the lock
    (every request adding one locks the attendee first).
    """
    checked: list[tuple[int, AttendeeIn, Attendee]] = []
    for index, item in items:
        candidate = _validated(index, item, plan, prefix)
        if candidate is not None:
            checked.append((index, item, candidate))
    ids = {item.external_id.strip() for _, item, _ in checked if item.external_id}
    keys = {plan.key(c.email) for _, _, c in checked}
    refs = dict(
        AttendeeRef.objects.filter(integration=integration, external_id__in=ids).values_list(
            "external_id", "attendee_id"
        )
    )
    # One instance per row, however it is found, each with its email as the database lowers it.
    rows = {
        a.pk: a
        for a in Attendee.objects.annotate(email_key=Lower("email"))
        .filter(Q(email_key__in=keys) | Q(pk__in=refs.values()))
        .order_by("pk")
        .select_for_update(no_key=True)
    }
    by_email = {a.email_key: a for a in rows.values() if a.email_key in keys}
    by_ref = {external: rows[pk] for external, pk in refs.items()}
    ref_of: dict[int, str] = {}  # attendee -> this integration's id for them
    own: set[int] = set()  # attendees this integration created and nobody else names
    others: set[int] = set()  # attendees another integration names
    for attendee_id, integration_id, external_id, created in AttendeeRef.objects.filter(
        attendee__in=list(rows)
    ).values_list("attendee_id", "integration_id", "external_id", "created_attendee"):
        if integration_id == integration.pk:
            ref_of[attendee_id] = external_id
            if created:
                own.add(attendee_id)
        else:
            others.add(attendee_id)
    own -= others
    seen_ids: dict[str, str] = {}  # external id -> key, within this request
    seen_emails: dict[str, str] = {}  # key -> external id, within this request
    planned_as: dict[int, str] = {}  # id() of a planned row -> its key
    for index, item, candidate in checked:
        key = plan.key(candidate.email)
        external = item.external_id.strip() if item.external_id else None
        if external is not None and seen_emails.setdefault(key, external) != external:
            plan.refuse(
                index,
                prefix + "external_id",
                f"{candidate.email} is given two ids in this request; one attendee has one id.",
                "duplicate_external_id",
                row_detail=f"Another row of this file gives {candidate.email} another "
                "external_id; one attendee has one id: give the same one, or keep one row.",
            )
            continue
        if external is not None and seen_ids.setdefault(external, key) != key:
            plan.refuse(
                index,
                prefix + "external_id",
                f"The id {external!r} is given for two emails in this request; one id names "
                "one attendee.",
                "duplicate_external_id",
                row_detail=f"Another row of this file gives the external_id {external!r} to "
                "another email; one id names one attendee: correct one of the two rows.",
            )
            continue
        mapped = by_ref.get(external) if external is not None else None
        owner = by_email.get(key)
        if (mapped or owner) is not None and (mapped or owner).erased_at is not None:
            plan.refuse(
                index,
                prefix + ("external_id" if mapped else "email"),
                "This attendee was erased at staff's request; to enrol the person again, send "
                "their real address" + (" under a new id." if mapped else "."),
                "attendee_erased",
                conflict=True,
                row_detail="This attendee was erased at staff's request; to enrol the person "
                "again, give their real address" + (" and a new external_id." if mapped else "."),
            )
            continue
        if mapped is not None and owner is not None and owner.pk != mapped.pk:
            taken = (
                f"{candidate.email} belongs to another attendee (id {owner.pk}) than the one "
                f"{external!r} names; an email is one attendee's: correct the email, or, to mean "
                "that attendee, "
            )
            theirs = ref_of.get(owner.pk)
            plan.refuse(
                index,
                prefix + "email",
                taken
                + (f"send external_id {theirs!r}." if theirs else "send it without external_id."),
                "email_taken",
                conflict=True,
                row_detail=taken
                + (
                    f"put {theirs!r} in the external_id column."
                    if theirs
                    else "leave the external_id blank."
                ),
            )
            continue
        if (
            mapped is None
            and owner is not None
            and external is not None
            and ref_of.get(owner.pk) not in (None, external)
        ):
            plan.refuse(
                index,
                prefix + "external_id",
                f"{candidate.email} is the attendee this integration calls "
                f"{ref_of[owner.pk]!r}; send that id, or none.",
                "external_id_mismatch",
                conflict=True,
                row_detail=f"{candidate.email} is the attendee this integration calls "
                f"{ref_of[owner.pk]!r}: put that id in the external_id column, or leave it blank.",
            )
            continue
        row = mapped or owner or plan.attendees.get(key)
        if (key in plan.attendees and plan.attendees[key] is not row) or (
            row is not None and planned_as.get(id(row), key) != key
        ):
            plan.refuse(
                index,
                prefix + "email",
                f"{candidate.email} and another item of this request name the same attendee "
                "with different emails; send one.",
                "conflicting_items",
                row_detail="Another row of this file names the same person with another email: "
                "keep one row.",
            )
            continue
        if row is None:
            if item.name is None or not candidate.name:
                plan.refuse(index, prefix + "name", "Give the new attendee's name.", "required")
                continue
            row = candidate
            plan.outcomes[key] = "created"
        else:  # found, or created by an earlier item: this item's details land too
            changes = {
                name: getattr(candidate, name)
                for name in ATTENDEE_FIELDS
                if getattr(item, name) is not None
                and getattr(row, name) != getattr(candidate, name)
            }
            if row.pk and row.email_key != key:
                changes["email"] = candidate.email  # another address (case alone is none)
            kept = False
            if changes and row.pk and row.pk not in own and not by_staff:
                if "email" in changes:
                    plan.refuse(
                        index,
                        prefix + "email",
                        f"Attendee {row.pk} is not this integration's own (it did not create "
                        "them, or staff or another integration also know them), so it may not "
                        "move them to another address: send the address they have, or, for "
                        "another person, another id; staff change an address in the admin.",
                        "attendee_not_own",
                        conflict=True,
                    )
                    continue
                # Their name, language and zone stay as whoever made them set them: the item
                # is enrolled all the same, and its outcome says so.
                changes, kept = {}, True
            for name, value in changes.items():
                setattr(row, name, value)
            if plan.outcomes.get(key) not in ("created", "updated"):
                plan.outcomes[key] = "updated" if changes else "kept" if kept else "unchanged"
        plan.attendees[key] = row
        planned_as[id(row)] = key
        if external is not None and ref_of.get(row.pk) is None and external not in by_ref:
            plan.new_refs[external] = key


def _lock_workshops(ids: list[int]) -> dict[int, Workshop]:
    """The workshops named, held against a cancel until the caller commits."""
    rows = Workshop.objects.filter(pk__in=ids).order_by("pk")
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(Workshop._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {table} WHERE id = ANY(%s) ORDER BY id FOR SHARE", [ids]
            )
    return {w.pk: w for w in rows}


def _resolved(
    integration: Integration,
    items: list[tuple[int, AttendeeIn]],
    prefix: str,
    *,
    by_staff: bool = False,
) -> _Plan:
    plan = _Plan(_lowered({(item.email or "").strip() for _, item in items}))
    _resolve_attendees(integration, items, plan, prefix, by_staff=by_staff)
    return plan


def _write_attendees(integration: Integration, plan: _Plan, *, by_staff: bool = False) -> None:
    """Insert and update in the order of the emails, as every request does: two requests
    creating the same people wait for each other instead of deadlocking. A ref made with its
    attendee records that the integration created them, unless staff did (the CSV import)."""
    ordered = sorted(plan.attendees.items())
    created = [a for key, a in ordered if plan.outcomes[key] == "created"]
    updated = [a for key, a in ordered if plan.outcomes[key] == "updated"]
    Attendee.objects.bulk_create(created)
    if updated:
        Attendee.objects.bulk_update(updated, ["email", *ATTENDEE_FIELDS])
    AttendeeRef.objects.bulk_create(
        [
            AttendeeRef(
                integration=integration,
                external_id=ext,
                attendee=plan.attendees[key],
                created_attendee=plan.outcomes[key] == "created" and not by_staff,
            )
            for ext, key in sorted(plan.new_refs.items())
        ]
    )


def _refuse_if(plan: _Plan) -> None:
    if plan.errors:
        plan.errors.sort(key=lambda e: e.index)
        raise Refused(plan.errors, conflict=plan.conflicts == len(plan.errors))


def _retrying(work):
    """Run ``work`` in a transaction; again if a concurrent request took a row first.

    Each attempt that loses sees the winner's rows on the next one, so only a
    request that loses to ATTEMPTS different writers in a row fails.
    """
    for attempt in range(ATTEMPTS):
        try:
            with transaction.atomic():
                return work()
        except (IntegrityError, OperationalError) as error:
            lost = isinstance(error, IntegrityError) or lost_a_race(error)
            if not lost or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def attendees_upsert(*, integration: Integration, items: list[AttendeeIn]) -> list[AttendeeOutcome]:
    """Create or update attendees by the integration's id or by email; all or nothing."""

    def work():
        plan = _resolved(integration, list(enumerate(items)), "")
        _refuse_if(plan)
        _write_attendees(integration, plan)
        return [
            AttendeeOutcome(plan.attendees[plan.key(i.email)], plan.outcomes[plan.key(i.email)])
            for i in items
        ]

    return _retrying(work)


def workshop_by_external_id(integration: Integration, external_id: str) -> Workshop | None:
    ref = (
        WorkshopRef.objects.select_related("workshop")
        .filter(integration=integration, external_id=external_id)
        .first()
    )
    return ref.workshop if ref else None


def enrolments_upsert(
    *,
    integration: Integration,
    items: list[EnrolmentIn],
    limit: int = MAX_ITEMS,
    by_staff: bool = False,
) -> list[EnrolmentOutcome]:
    """Enrol each item's attendee (upserted) in its workshop; all or nothing.

    An enrolment that exists and is active is ``unchanged``; a cancelled one
    refuses the request (reactivation is its own action), as does an erased
    attendee or a cancelled workshop. A preview runs it in a transaction it rolls back
    (intake.imports). ``by_staff``: staff's CSV import, which may change any attendee's
    details (as the admin may) and whose new attendees are not the integration's own.
    """
    if len(items) > limit:
        raise Refused([ItemError(-1, "items", f"Send at most {limit} items.", "too_many")])

    def work():
        # The lock order: attendees, then workshops.
        plan = _resolved(
            integration,
            [(i, item.attendee) for i, item in enumerate(items)],
            "attendee.",
            by_staff=by_staff,
        )
        refs = dict(
            WorkshopRef.objects.filter(
                integration=integration,
                external_id__in={i.workshop_external_id for i in items if i.workshop_external_id},
            ).values_list("external_id", "workshop_id")
        )
        wanted: list[int | None] = []
        for index, item in enumerate(items):
            if item.workshop_id is None and item.workshop_external_id is None:
                plan.refuse(
                    index,
                    "workshop",
                    "Name the workshop: workshop or workshop_external_id.",
                    "required",
                )
                wanted.append(None)
            elif (
                item.workshop_id is not None
                and item.workshop_external_id is not None
                and ((named := refs.get(item.workshop_external_id)) != item.workshop_id)
            ):
                # Two names for two workshops (or for none): which was meant is not known.
                plan.refuse(
                    index,
                    "workshop_external_id",
                    f"The id {item.workshop_external_id!r} names "
                    + (f"workshop {named}" if named else "no workshop")
                    + f", not workshop {item.workshop_id}: send one of the two.",
                    "workshop_mismatch",
                )
                wanted.append(None)
            elif item.workshop_id is not None:
                wanted.append(item.workshop_id)
            else:
                wanted.append(refs.get(item.workshop_external_id, -1))
        workshops = _lock_workshops(sorted({w for w in wanted if w and w > 0}))
        for index, (item, wid) in enumerate(zip(items, wanted, strict=True)):
            if wid is None:
                continue
            workshop = workshops.get(wid)
            if workshop is None:
                where = (
                    f"id {item.workshop_id}"
                    if item.workshop_id is not None
                    else f"external id {item.workshop_external_id!r}"
                )
                plan.refuse(index, "workshop", f"No workshop has {where}.", "not_found")
            elif not workshop.is_scheduled:
                plan.refuse(
                    index,
                    "workshop",
                    f"Workshop {wid} is cancelled; enrol in a scheduled workshop.",
                    "workshop_cancelled",
                    conflict=True,
                )
        bad = {e.index for e in plan.errors}
        known = [
            (plan.attendees[plan.key(item.attendee.email)].pk, wid)
            for index, (item, wid) in enumerate(zip(items, wanted, strict=True))
            if index not in bad and plan.attendees[plan.key(item.attendee.email)].pk
        ]
        existing = {}
        if known:
            existing = {
                (e.attendee_id, e.workshop_id): e
                for e in Enrollment.objects.filter(
                    attendee_id__in={a for a, _ in known}, workshop_id__in={w for _, w in known}
                )
            }
        for index, (item, wid) in enumerate(zip(items, wanted, strict=True)):
            if index in bad:
                continue
            # An erased attendee was refused while resolving: these are all enrollable.
            attendee = plan.attendees[plan.key(item.attendee.email)]
            enrolment = existing.get((attendee.pk, wid))
            if enrolment is not None and enrolment.status == Enrollment.Status.CANCELLED:
                plan.refuse(
                    index,
                    "attendee",
                    f"Enrolment {enrolment.pk} was cancelled; a re-post does not bring it back. "
                    f"To enrol the attendee again, POST /api/enrolments/{enrolment.pk}/reactivate.",
                    "enrolment_cancelled",
                    conflict=True,
                    row_detail="This attendee's enrolment in this workshop was cancelled, and an "
                    "import does not enrol them again: set the enrolment back to active on the "
                    "workshop's page, or take the row out of the file.",
                )
        _refuse_if(plan)
        _write_attendees(integration, plan, by_staff=by_staff)
        pairs: dict[tuple[int, int], int] = {}  # new (attendee, workshop) -> first item
        chosen = []
        for index, (item, wid) in enumerate(zip(items, wanted, strict=True)):
            key = plan.key(item.attendee.email)
            pair = (plan.attendees[key].pk, wid)
            chosen.append((key, pair))
            if pair not in existing:
                pairs.setdefault(pair, index)
        new = sorted(pairs)  # in one order for every request, as the attendees
        made = dict(zip(new, enrollments_add(pairs=new), strict=True))
        return [
            EnrolmentOutcome(
                index,
                "created" if pairs.get(pair) == index else "unchanged",
                pair[0],
                plan.outcomes[key],
                pair[1],
                existing[pair].pk if pair in existing else made[pair],
            )
            for index, (key, pair) in enumerate(chosen)
        ]

    return _retrying(work)
