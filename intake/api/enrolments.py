"""Enrolments: one or a bulk of up to 1,000, all or nothing; cancel; reactivate."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.core.exceptions import ValidationError
from django.db import transaction
from ninja import Field, Path, Query, Router, Schema, Status

from intake import services
from intake.api.attendees import AttendeeIn, attendee_in
from intake.api.common import (
    ExternalId,
    Id,
    Input,
    Paging,
    Reason,
    Scope,
    TokenActor,
    audit,
    audit_decision,
    errors,
    get_or_404,
    page_of,
    require,
)
from intake.problems import field_errors, problem
from reminders.services.enrollment_decisions import enrollments_cancel
from workshops.models import Enrollment
from workshops.services import enrollment_create

enrolments = Router(tags=["enrolments"])
# Why enrollment_create refuses a cancelled enrolment back, by the field it names.
REACTIVATION_REFUSED = {"workshop": "workshop_cancelled", "attendee": "attendee_erased"}


class EnrolmentIn(Input):
    workshop: Id | None = Field(None, description="Our id of the workshop.")
    workshop_external_id: ExternalId | None = Field(
        None,
        description="This integration's id of the workshop, instead (with both, they must name "
        "the same one).",
    )
    attendee: AttendeeIn


class BulkIn(Input):
    items: list[EnrolmentIn] = Field(min_length=1, max_length=services.MAX_ITEMS)


class EnrolmentOut(Schema):
    id: int
    workshop: int
    attendee: int
    status: Literal["active", "cancelled"]
    created_at: datetime
    updated_at: datetime


class EnrolmentResult(Schema):
    index: int
    outcome: Literal["created", "unchanged"]
    enrolment: int
    workshop: int
    attendee: int
    attendee_outcome: Literal["created", "updated", "unchanged", "kept"]


class BulkOut(Schema):
    created: int
    unchanged: int
    items: list[EnrolmentResult]


class EnrolmentPage(Schema):
    page: int
    page_size: int
    has_next: bool
    items: list[EnrolmentOut]


def _enrolment_out(e: Enrollment) -> dict:
    return {
        "id": e.pk,
        "workshop": e.workshop_id,
        "attendee": e.attendee_id,
        "status": e.status,
        "created_at": e.created_at,
        "updated_at": e.updated_at,
    }


def _result_out(r: services.EnrolmentOutcome) -> dict:
    return {
        "index": r.index,
        "outcome": r.outcome,
        "enrolment": r.enrolment_id,
        "workshop": r.workshop_id,
        "attendee": r.attendee_id,
        "attendee_outcome": r.attendee_outcome,
    }


def _upsert(
    request, items: list[EnrolmentIn], *, status_if_new: int
) -> list[services.EnrolmentOutcome]:
    """Upsert ``items``; the audit records ``status_if_new`` as the answer's status if one is new."""
    token = require(request, Scope.ENROLMENTS)
    wanted = [
        services.EnrolmentIn(
            attendee=attendee_in(item.attendee),
            workshop_id=item.workshop,
            workshop_external_id=item.workshop_external_id,
        )
        for item in items
    ]
    with transaction.atomic():
        results = services.enrolments_upsert(integration=token.integration, items=wanted)
        made = [r.enrolment_id for r in results if r.outcome == "created"]
        touched = [r.attendee_id for r in results if r.attendee_outcome in ("created", "updated")]
        if made or touched:
            audit(
                request,
                status_if_new if made else 200,
                enrolments_created=made,
                attendees_changed=sorted(set(touched)),
                items=len(results),
            )
    return results


@enrolments.post("", response={200: EnrolmentResult, 201: EnrolmentResult, **errors(409, 422)})
def create_enrolment(request, body: EnrolmentIn):
    """Enrol an attendee (upserted as POST /api/attendees does). The same enrolment again
    comes back unchanged (200), with no second reminder."""
    (result,) = _upsert(request, [body], status_if_new=201)
    return Status(201 if result.outcome == "created" else 200, _result_out(result))


@enrolments.post("/bulk", response={200: BulkOut, **errors(409, 413, 422)})
def bulk_enrolments(request, body: BulkIn):
    """Up to 1,000 enrolments, all or nothing: one refused item refuses the request, with
    each item's reason, and nothing is written."""
    results = _upsert(request, body.items, status_if_new=200)
    created = sum(r.outcome == "created" for r in results)
    return {
        "created": created,
        "unchanged": len(results) - created,
        "items": [_result_out(r) for r in results],
    }


@enrolments.get("", response={200: EnrolmentPage, **errors(422)})
def list_enrolments(
    request,
    paging: Query[Paging],
    workshop: Id | None = None,
    attendee: Id | None = None,
    status: Literal["active", "cancelled"] | None = None,
):
    require(request, Scope.READ)
    rows = Enrollment.objects.order_by("pk")
    if workshop:
        rows = rows.filter(workshop_id=workshop)
    if attendee:
        rows = rows.filter(attendee_id=attendee)
    if status:
        rows = rows.filter(status=status)
    return page_of(rows, paging, _enrolment_out)


@enrolments.get("/{enrolment_id}", response={200: EnrolmentOut, **errors(404, 422)})
def get_enrolment(request, enrolment_id: Path[Id]):
    require(request, Scope.READ)
    return _enrolment_out(get_or_404(Enrollment.objects, enrolment_id, "enrolment"))


@enrolments.post("/{enrolment_id}/cancel", response={200: EnrolmentOut, **errors(404, 409, 422)})
def cancel_enrolment(request, enrolment_id: Path[Id], body: Reason):
    """Cancel an enrolment with a reason: its unsent reminder is cancelled; recorded as a
    staff decision."""
    token = require(request, Scope.ENROLMENTS)
    enrolment = get_or_404(Enrollment.objects, enrolment_id, "enrolment")
    if enrolment.status != Enrollment.Status.ACTIVE:
        return problem(
            409, f"Enrolment {enrolment.pk} is already cancelled.", code="already_cancelled"
        )
    result = enrollments_cancel(
        enrollments=Enrollment.objects.filter(pk=enrolment.pk),
        reason=body.reason,
        actor=TokenActor(token),
        also=audit_decision(request, enrolment=enrolment.pk),
    )
    if not result.changed:  # cancelled by another request since the read above
        return problem(
            409, f"Enrolment {enrolment.pk} is already cancelled.", code="already_cancelled"
        )
    enrolment.refresh_from_db()
    return _enrolment_out(enrolment)


@enrolments.post(
    "/{enrolment_id}/reactivate", response={200: EnrolmentOut, **errors(404, 409, 422)}
)
def reactivate_enrolment(request, enrolment_id: Path[Id]):
    """Enrol a cancelled enrolment's attendee again, explicitly (a re-post never does)."""
    require(request, Scope.ENROLMENTS)
    with transaction.atomic():
        # The enrolment as it is now, held: a reactivation under way is waited for, then seen.
        enrolment = get_or_404(
            Enrollment.objects.select_related("attendee", "workshop").select_for_update(
                of=("self",), no_key=True
            ),
            enrolment_id,
            "enrolment",
        )
        if enrolment.status == Enrollment.Status.ACTIVE:
            return problem(409, f"Enrolment {enrolment.pk} is active.", code="already_active")
        try:
            saved = enrollment_create(attendee=enrolment.attendee, workshop=enrolment.workshop)
        except ValidationError as refused:
            # The workshop or attendee as they are now refuse it, as in a bulk: a conflict.
            return problem(
                409,
                f"Enrolment {enrolment.pk} stays cancelled; see errors for why.",
                code="conflict",
                errors=[
                    {**e, "code": REACTIVATION_REFUSED.get(e["field"], "conflict")}
                    for e in field_errors(refused.message_dict)
                ],
            )
        audit(request, 200, enrolment=saved.pk, outcome="reactivated")
    return _enrolment_out(saved)
