"""Workshops: create (idempotent by the integration's id), read, change, cancel, reinstate."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.conf import settings
from django.db import IntegrityError, transaction
from ninja import Path, Query, Router, Schema, Status

from intake import services
from intake.api.common import (
    ExternalId,
    Id,
    Input,
    Language,
    Paging,
    Reason,
    Scope,
    Text,
    Title,
    TokenActor,
    When,
    audit,
    audit_decision,
    errors,
    get_or_404,
    page_of,
    require,
)
from intake.models import ApiToken, WorkshopRef
from intake.problems import problem
from reminders.services.workshop_decisions import workshops_cancel, workshops_reinstate
from workshops.models import Workshop
from workshops.services import workshop_create, workshop_update

workshops = Router(tags=["workshops"])
WORKSHOP_DETAILS = (
    "location", "join_url", "contact_name", "contact_email",
    "language", "reminder_subject", "reminder_intro", "notice_intro",
)  # fmt: skip


class WorkshopIn(Input):
    title: Title
    starts_at: When
    ends_at: When
    timezone: Text
    location: Text = ""
    join_url: Text = ""
    contact_name: Text = ""
    contact_email: Text = ""
    language: Language = settings.LANGUAGE_CODE
    reminder_subject: Text = ""
    reminder_intro: Text = ""
    notice_intro: Text = ""
    external_id: ExternalId | None = None


class WorkshopPatch(Input):
    title: Title | None = None
    starts_at: When | None = None
    ends_at: When | None = None
    timezone: Text | None = None
    location: Text | None = None
    join_url: Text | None = None
    contact_name: Text | None = None
    contact_email: Text | None = None
    language: Language | None = None
    reminder_subject: Text | None = None
    reminder_intro: Text | None = None
    notice_intro: Text | None = None


class WorkshopOut(Schema):
    id: int
    external_id: str | None
    title: str
    starts_at: datetime
    ends_at: datetime
    timezone: str
    status: Literal["scheduled", "cancelled"]
    cancellation_reason: str
    location: str
    join_url: str
    contact_name: str
    contact_email: str
    language: str
    reminder_subject: str
    reminder_intro: str
    notice_intro: str
    created_at: datetime
    updated_at: datetime


class WorkshopPage(Schema):
    page: int
    page_size: int
    has_next: bool
    items: list[WorkshopOut]


def _workshop_out(workshop: Workshop, external_id: str | None) -> dict:
    return {
        **{f.attname: getattr(workshop, f.attname) for f in Workshop._meta.concrete_fields},
        "external_id": external_id,
    }


def _external_ids(token: ApiToken, workshop_ids) -> dict[int, str]:
    return dict(
        WorkshopRef.objects.filter(
            integration_id=token.integration_id, workshop_id__in=list(workshop_ids)
        ).values_list("workshop_id", "external_id")
    )


def one_workshop(token: ApiToken, workshop: Workshop) -> dict:
    return _workshop_out(workshop, _external_ids(token, [workshop.pk]).get(workshop.pk))


@workshops.get("", response={200: WorkshopPage, **errors(422)})
def list_workshops(
    request,
    paging: Query[Paging],
    status: Literal["scheduled", "cancelled"] | None = None,
    external_id: ExternalId | None = None,
    starts_after: When | None = None,
):
    """Workshops by start, filtered by status, start or this integration's id for them."""
    token = require(request, Scope.READ)
    rows = Workshop.objects.order_by("starts_at", "pk")
    if status:
        rows = rows.filter(status=status)
    if starts_after:
        rows = rows.filter(starts_at__gt=starts_after)
    if external_id:
        rows = rows.filter(
            pk__in=WorkshopRef.objects.filter(
                integration_id=token.integration_id, external_id=external_id
            ).values("workshop_id")
        )
    page = page_of(rows, paging, lambda w: w)
    ids = _external_ids(token, [w.pk for w in page["items"]])
    page["items"] = [_workshop_out(w, ids.get(w.pk)) for w in page["items"]]
    return page


@workshops.post("", response={200: WorkshopOut, 201: WorkshopOut, **errors(409, 422)})
def create_workshop(request, body: WorkshopIn):
    """Create a workshop. With an ``external_id`` already used, the same one comes back
    (200) if nothing differs, else a 409: change it with PATCH."""
    token = require(request, Scope.WORKSHOPS)
    values = body.dict(exclude={"external_id"})
    with transaction.atomic():
        if body.external_id is not None:
            existing = services.workshop_by_external_id(token.integration, body.external_id)
            if existing is not None:
                differs = sorted(
                    name for name, value in values.items() if getattr(existing, name) != value
                )
                if differs:
                    return problem(
                        409,
                        f"Workshop {existing.pk} has external id {body.external_id!r} and "
                        f"differs in {', '.join(differs)}; change it with PATCH "
                        f"/api/workshops/{existing.pk}.",
                        code="external_id_taken",
                        errors=[
                            {"field": n, "detail": "differs", "code": "differs"} for n in differs
                        ],
                    )
                return Status(200, _workshop_out(existing, body.external_id))
        try:
            with transaction.atomic():
                workshop = workshop_create(**values)
                if body.external_id is not None:
                    WorkshopRef.objects.create(
                        integration=token.integration,
                        external_id=body.external_id,
                        workshop=workshop,
                    )
        except IntegrityError:
            # A concurrent POST took the id first: answer as the repeat it is.
            if body.external_id is None or not services.workshop_by_external_id(
                token.integration, body.external_id
            ):
                raise
            return create_workshop(request, body)
        audit(request, 201, workshop=workshop.pk, outcome="created")
    return Status(201, _workshop_out(workshop, body.external_id))


@workshops.get("/{workshop_id}", response={200: WorkshopOut, **errors(404, 422)})
def get_workshop(request, workshop_id: Path[Id]):
    token = require(request, Scope.READ)
    return one_workshop(token, get_or_404(Workshop.objects, workshop_id, "workshop"))


@workshops.patch("/{workshop_id}", response={200: WorkshopOut, **errors(404, 422)})
def update_workshop(request, workshop_id: Path[Id], body: WorkshopPatch):
    """Change a workshop; its reminders and the attendees already reminded follow."""
    token = require(request, Scope.WORKSHOPS)
    workshop = get_or_404(Workshop.objects, workshop_id, "workshop")
    changes = body.dict(exclude_unset=True)
    if any(value is None for value in changes.values()):
        nulls = [name for name, value in changes.items() if value is None]
        return problem(
            422,
            "Leave out what should not change; null is no value.",
            code="invalid",
            errors=[{"field": n, "detail": "May not be null.", "code": "invalid"} for n in nulls],
        )
    with transaction.atomic():
        # What differs from the workshop as it is now, held (as the service holds it) to the end.
        current = get_or_404(
            Workshop.objects.select_for_update(no_key=True), workshop.pk, "workshop"
        )
        changed = sorted(name for name, value in changes.items() if getattr(current, name) != value)
        saved = workshop_update(workshop=current, **changes)
        if changed:  # a repeat leaves no row
            audit(request, 200, workshop=saved.pk, changed=changed)
    return one_workshop(token, saved)


@workshops.post("/{workshop_id}/cancel", response={200: WorkshopOut, **errors(404, 409, 422)})
def cancel_workshop(request, workshop_id: Path[Id], body: Reason):
    """Cancel, with a reason attendees already reminded are told; recorded as a staff decision."""
    token = require(request, Scope.WORKSHOPS)
    workshop = get_or_404(Workshop.objects, workshop_id, "workshop")
    if not workshop.is_scheduled:
        return problem(
            409, f"Workshop {workshop.pk} is already cancelled.", code="already_cancelled"
        )
    result = workshops_cancel(
        workshops=Workshop.objects.filter(pk=workshop.pk),
        reason=body.reason,
        actor=TokenActor(token),
        also=audit_decision(request, workshop=workshop.pk),
    )
    if not result.changed:  # cancelled by another request since the read above
        return problem(
            409, f"Workshop {workshop.pk} is already cancelled.", code="already_cancelled"
        )
    workshop.refresh_from_db()
    return one_workshop(token, workshop)


@workshops.post("/{workshop_id}/reinstate", response={200: WorkshopOut, **errors(404, 409, 422)})
def reinstate_workshop(request, workshop_id: Path[Id], body: Reason):
    """Bring a cancelled workshop back; recorded as a staff decision."""
    token = require(request, Scope.WORKSHOPS)
    workshop = get_or_404(Workshop.objects, workshop_id, "workshop")
    if workshop.is_scheduled:
        return problem(409, f"Workshop {workshop.pk} is not cancelled.", code="not_cancelled")
    result = workshops_reinstate(
        workshops=Workshop.objects.filter(pk=workshop.pk),
        reason=body.reason,
        actor=TokenActor(token),
        also=audit_decision(request, workshop=workshop.pk),
    )
    if not result.changed:  # reinstated by another request since the read above
        return problem(409, f"Workshop {workshop.pk} is not cancelled.", code="not_cancelled")
    workshop.refresh_from_db()
    return one_workshop(token, workshop)
