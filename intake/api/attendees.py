"""Attendees: upsert by the integration's id or by email; read."""

from __future__ import annotations

from typing import Literal

from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Lower
from ninja import Path, Query, Router, Schema, Status

from intake import services
from intake.api.common import (
    AttendeeLanguage,
    Email,
    ExternalId,
    Id,
    Input,
    Paging,
    Scope,
    Text,
    audit,
    errors,
    get_or_404,
    page_of,
    require,
)
from intake.models import AttendeeRef
from workshops.models import Attendee

attendees = Router(tags=["attendees"])


class AttendeeIn(Input):
    email: Email
    name: Text | None = None
    language: AttendeeLanguage | None = None
    timezone: Text | None = None
    external_id: ExternalId | None = None


class AttendeeOut(Schema):
    id: int
    email: str
    name: str
    language: str
    timezone: str
    erased: bool


class AttendeeUpsertOut(AttendeeOut):
    outcome: Literal["created", "updated", "unchanged", "kept"]


class AttendeePage(Schema):
    page: int
    page_size: int
    has_next: bool
    items: list[AttendeeOut]


def attendee_out(attendee: Attendee, **extra) -> dict:
    erased = attendee.erased_at is not None  # its placeholders are nobody's to see
    return {
        "id": attendee.pk,
        "email": "" if erased else attendee.email,
        "name": "" if erased else attendee.name,
        "language": attendee.language,
        "timezone": attendee.timezone,
        "erased": erased,
        **extra,
    }


def attendee_in(body: AttendeeIn) -> services.AttendeeIn:
    return services.AttendeeIn(**body.dict())


@attendees.post("", response={200: AttendeeUpsertOut, 201: AttendeeUpsertOut, **errors(409, 422)})
def upsert_attendee(request, body: AttendeeIn):
    """Create or update an attendee, found by this integration's id for them, else by email.
    Fields left out stay as they are."""
    token = require(request, Scope.ENROLMENTS)
    with transaction.atomic():
        (done,) = services.attendees_upsert(
            integration=token.integration, items=[attendee_in(body)]
        )
        status = 201 if done.outcome == "created" else 200
        if done.outcome in ("created", "updated"):
            audit(request, status, attendee=done.attendee.pk, outcome=done.outcome)
    return Status(status, attendee_out(done.attendee, outcome=done.outcome))


@attendees.get("", response={200: AttendeePage, **errors(422)})
def list_attendees(
    request,
    paging: Query[Paging],
    email: Email | None = None,
    external_id: ExternalId | None = None,
):
    """Attendees by email, filtered by email or this integration's id for them."""
    token = require(request, Scope.READ)
    rows = Attendee.objects.order_by("email", "pk")
    if email:
        # As the unique constraint (and so the upsert) judges an email: the database's LOWER.
        rows = rows.annotate(email_key=Lower("email")).filter(email_key=Lower(Value(email)))
    if external_id:
        rows = rows.filter(
            pk__in=AttendeeRef.objects.filter(
                integration_id=token.integration_id, external_id=external_id
            ).values("attendee_id")
        )
    return page_of(rows, paging, attendee_out)


@attendees.get("/{attendee_id}", response={200: AttendeeOut, **errors(404, 422)})
def get_attendee(request, attendee_id: Path[Id]):
    require(request, Scope.READ)
    return attendee_out(get_or_404(Attendee.objects, attendee_id, "attendee"))
