"""The HTTP API under /api/ (django-ninja): workshops, attendees, enrolments, reminders.

Each request carries ``Authorization: Bearer <token>`` (intake.tokens); each
operation needs one scope. Writes go through the same services as the admin
(workshops.services, the staff decisions) and the all-or-nothing intake
(intake.services), and each accepted write leaves an ApiWrite row naming its
token. Errors are RFC 9457 problem documents (intake.problems).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Prefetch, QuerySet
from django.http import Http404
from ninja import Field, NinjaAPI, Path, Query, Router, Schema, Status
from ninja.errors import AuthenticationError, AuthorizationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.openapi.views import openapi_json
from ninja.security import HttpBearer
from pydantic import AfterValidator, BeforeValidator

from clock import default_clock
from intake import services
from intake.models import ApiToken, ApiWrite, AttendeeRef, WorkshopRef
from intake.problems import PROBLEM_TYPE, Problem, field_errors, problem
from intake.ratelimit import RateLimited, rate_check
from intake.tokens import token_authenticate
from reminders.locks import lock_not_available
from reminders.models import DeliveryAttempt, Notice, Reminder
from reminders.services.enrollment_decisions import enrollments_cancel
from reminders.services.workshop_decisions import workshops_cancel, workshops_reinstate
from workshops.models import Attendee, Enrollment, Workshop
from workshops.services import enrollment_create, workshop_create, workshop_update

Scope = ApiToken.Scope
MAX_ID = 2**63 - 1  # BigAutoField
MAX_PAGE = 100_000


# ---- input types -------------------------------------------------------------------------


def _plain_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("Text may not contain NUL characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("Text must be valid Unicode (no lone surrogates).") from None
    return value


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("Give a time zone with the time, e.g. 2027-03-01T09:00:00+01:00.")
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        value = None
    # The admin's range (reminders.admin.forms.aware_in_zone): past it a zone's offset overflows.
    if value is None or not 1971 <= value.year <= 9998:
        raise ValueError("The date is out of range: give one between 1971 and 9998.")
    return value


Text = Annotated[str, AfterValidator(_plain_text)]
When = Annotated[datetime, AfterValidator(_aware)]
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
ExternalId = Annotated[Text, Field(min_length=1, max_length=200)]


def _stripped(value):
    return value.strip() if isinstance(value, str) else value


Email = Annotated[
    Text, BeforeValidator(_stripped), Field(max_length=254, json_schema_extra={"format": "email"})
]
LANGUAGES = tuple(code for code, _ in settings.LANGUAGES)
Language = Literal[LANGUAGES]  # type: ignore[valid-type]
AttendeeLanguage = Literal[("", *LANGUAGES)]  # type: ignore[valid-type]


# ---- auth, limits, audit -----------------------------------------------------------------


class TokenAuth(HttpBearer):
    def authenticate(self, request, token: str) -> ApiToken | None:
        found = token_authenticate(token)
        if found is not None:
            rate_check(found)
        return found


def _docs_behind_admin_login(view):
    """The interactive docs need a staff login; the schema itself is public (it holds no data)."""
    if getattr(view, "func", None) is openapi_json:
        return view
    return staff_member_required(view)


api = NinjaAPI(
    title="Workshop Reminders API",
    version="1",
    description=(
        "Push workshops, attendees and enrolments in; read reminders and change notices. "
        "Send `Authorization: Bearer <token>`; staff create tokens in the admin "
        "(API tokens) or with `manage.py create_api_token`. Errors are RFC 9457 problem "
        "documents. Writes are all or nothing."
    ),
    openapi_url="/schema",
    docs_url="/docs",
    docs_decorator=_docs_behind_admin_login,
    auth=TokenAuth(),
    urls_namespace="api",
)


def _require(request, scope: str) -> ApiToken:
    token: ApiToken = request.auth
    if scope not in token.scopes:
        raise AuthorizationError(
            message=f"This token may not do this: it needs the '{scope}' scope, and has "
            f"{', '.join(token.scopes) or 'none'}. Create a token with that scope."
        )
    return token


def _audit(request, status: int, **summary) -> None:
    token: ApiToken = request.auth
    ApiWrite.objects.create(
        token=token,
        token_label=token.label,
        created_at=default_clock().now(),
        method=request.method,
        path=request.path[:300],
        status=status,
        summary=summary,
    )


class TokenActor:
    """A token standing where a staff member would in a StaffDecision: named, without a user."""

    pk = None

    def __init__(self, token: ApiToken) -> None:
        self.token = token

    def get_username(self) -> str:
        return self.token.label[:150]


# ---- errors ------------------------------------------------------------------------------


@api.exception_handler(NinjaValidationError)
def _invalid(request, exc: NinjaValidationError):
    items = []
    for error in exc.errors:
        where = [str(part) for part in error.get("loc", ()) if part not in ("body", "payload")]
        if where and where[0] in ("query", "path"):
            where = where[1:]
        message = error.get("msg", "Invalid value.").removeprefix("Value error, ")
        item = {"field": ".".join(where) or "body", "detail": message, "code": "invalid"}
        if len(where) > 2 and where[0] == "items" and where[1].isdigit():
            item.update(index=int(where[1]), field=".".join(where[2:]))
        items.append(item)
    return problem(
        422, "The request is invalid; see errors for each field.", code="invalid", errors=items
    )


@api.exception_handler(DjangoValidationError)
def _refused_by_model(request, exc: DjangoValidationError):
    errors = (
        field_errors(exc.message_dict)
        if hasattr(exc, "error_dict")
        else [{"field": "body", "detail": m, "code": "invalid"} for m in exc.messages]
    )
    return problem(
        422, "The request is invalid; see errors for each field.", code="invalid", errors=errors
    )


@api.exception_handler(services.Refused)
def _refused(request, exc: services.Refused):
    status = 409 if exc.conflict else 422
    return problem(
        status,
        f"Nothing was written: {len(exc.errors)} item(s) refused; fix them and send the "
        "request again.",
        code="conflict" if exc.conflict else "invalid",
        errors=[
            {"field": e.field, "detail": e.detail, "code": e.code, "index": e.index}
            for e in exc.errors
        ],
    )


@api.exception_handler(RateLimited)
def _limited(request, exc: RateLimited):
    return problem(
        429,
        f"This token sent more than {exc.limit} requests in {exc.window} s; retry after "
        f"{exc.retry_after} s.",
        code="rate_limited",
        headers={"Retry-After": str(exc.retry_after)},
    )


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return problem(
        401,
        "Send a live API token as 'Authorization: Bearer <token>'; this one is missing, "
        "unknown or revoked.",
        code="unauthenticated",
        headers={"WWW-Authenticate": 'Bearer realm="api"'},
    )


@api.exception_handler(AuthorizationError)
def _forbidden(request, exc):
    return problem(403, exc.message, code="forbidden")


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return problem(
        413,
        f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 1024} KiB: "
        "send fewer items per request.",
        code="too_large",
    )


@api.exception_handler(OperationalError)
def _busy(request, exc: OperationalError):
    if not lock_not_available(exc):
        raise exc
    return problem(
        503,
        "Staff or a worker hold these rows right now; nothing changed: retry in a moment.",
        code="busy",
        headers={"Retry-After": "1"},
    )


@api.exception_handler(Http404)
def _not_found(request, exc):
    return problem(404, str(exc) or "Not found.", code="not_found")


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    return problem(exc.status_code, exc.message, code="bad_request")


# The schema names the problem documents' real media type.
_base_schema = api.get_openapi_schema


def _schema(*args, **kwargs):
    schema = _base_schema(*args, **kwargs)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if int(status) >= 400 and "application/json" in content:
                    response["content"] = {PROBLEM_TYPE: content["application/json"]}
    return schema


api.get_openapi_schema = _schema


def errors(*statuses: int) -> dict:
    return {s: Problem for s in (401, 403, 429, 503, *statuses)}


def _get(queryset: QuerySet, pk: int, what: str):
    found = queryset.filter(pk=pk).first()
    if found is None:
        raise Http404(f"No {what} has id {pk}.")
    return found


# ---- paging ------------------------------------------------------------------------------


class Paging(Schema):
    page: int = Field(1, ge=1, le=MAX_PAGE)
    page_size: int = Field(100, ge=1, le=500)


def _page(queryset: QuerySet, paging: Paging, convert) -> dict:
    start = (paging.page - 1) * paging.page_size
    rows = list(queryset[start : start + paging.page_size + 1])
    return {
        "page": paging.page,
        "page_size": paging.page_size,
        "has_next": len(rows) > paging.page_size,
        "items": [convert(row) for row in rows[: paging.page_size]],
    }


# ---- workshops ---------------------------------------------------------------------------

workshops = Router(tags=["workshops"])
WORKSHOP_DETAILS = (
    "location", "join_url", "contact_name", "contact_email",
    "language", "reminder_subject", "reminder_intro", "notice_intro",
)  # fmt: skip


class WorkshopIn(Schema):
    title: Text
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


class WorkshopPatch(Schema):
    title: Text | None = None
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


class Reason(Schema):
    reason: Text = Field(
        description="Why; recorded with the decision, and told to attendees of a cancelled workshop."
    )


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


def _one_workshop(token: ApiToken, workshop: Workshop) -> dict:
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
    token = _require(request, Scope.READ)
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
    page = _page(rows, paging, lambda w: w)
    ids = _external_ids(token, [w.pk for w in page["items"]])
    page["items"] = [_workshop_out(w, ids.get(w.pk)) for w in page["items"]]
    return page


@workshops.post("", response={200: WorkshopOut, 201: WorkshopOut, **errors(409, 422)})
def create_workshop(request, body: WorkshopIn):
    """Create a workshop. With an ``external_id`` already used, the same one comes back
    (200) if nothing differs, else a 409: change it with PATCH."""
    token = _require(request, Scope.WORKSHOPS)
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
        _audit(request, 201, workshop=workshop.pk, outcome="created")
    return Status(201, _workshop_out(workshop, body.external_id))


@workshops.get("/{workshop_id}", response={200: WorkshopOut, **errors(404, 422)})
def get_workshop(request, workshop_id: Path[Id]):
    token = _require(request, Scope.READ)
    return _one_workshop(token, _get(Workshop.objects, workshop_id, "workshop"))


@workshops.patch("/{workshop_id}", response={200: WorkshopOut, **errors(404, 422)})
def update_workshop(request, workshop_id: Path[Id], body: WorkshopPatch):
    """Change a workshop; its reminders and the attendees already reminded follow."""
    token = _require(request, Scope.WORKSHOPS)
    workshop = _get(Workshop.objects, workshop_id, "workshop")
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
        saved = workshop_update(workshop=workshop, **changes)
        _audit(request, 200, workshop=saved.pk, changed=sorted(changes))
    return _one_workshop(token, saved)


@workshops.post("/{workshop_id}/cancel", response={200: WorkshopOut, **errors(404, 409, 422)})
def cancel_workshop(request, workshop_id: Path[Id], body: Reason):
    """Cancel, with a reason attendees already reminded are told; recorded as a staff decision."""
    token = _require(request, Scope.WORKSHOPS)
    workshop = _get(Workshop.objects, workshop_id, "workshop")
    if not workshop.is_scheduled:
        return problem(
            409, f"Workshop {workshop.pk} is already cancelled.", code="already_cancelled"
        )
    result = workshops_cancel(
        workshops=Workshop.objects.filter(pk=workshop.pk),
        reason=body.reason,
        actor=TokenActor(token),
    )
    _audit(request, 200, workshop=workshop.pk, decision=result.audit_id, reminders=result.reminders)
    workshop.refresh_from_db()
    return _one_workshop(token, workshop)


@workshops.post("/{workshop_id}/reinstate", response={200: WorkshopOut, **errors(404, 409, 422)})
def reinstate_workshop(request, workshop_id: Path[Id], body: Reason):
    """Bring a cancelled workshop back; recorded as a staff decision."""
    token = _require(request, Scope.WORKSHOPS)
    workshop = _get(Workshop.objects, workshop_id, "workshop")
    if workshop.is_scheduled:
        return problem(409, f"Workshop {workshop.pk} is not cancelled.", code="not_cancelled")
    result = workshops_reinstate(
        workshops=Workshop.objects.filter(pk=workshop.pk),
        reason=body.reason,
        actor=TokenActor(token),
    )
    _audit(request, 200, workshop=workshop.pk, decision=result.audit_id, reminders=result.reminders)
    workshop.refresh_from_db()
    return _one_workshop(token, workshop)


# ---- attendees ---------------------------------------------------------------------------

attendees = Router(tags=["attendees"])


class AttendeeIn(Schema):
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
    outcome: Literal["created", "updated", "unchanged"]


class AttendeePage(Schema):
    page: int
    page_size: int
    has_next: bool
    items: list[AttendeeOut]


def _attendee_out(attendee: Attendee, **extra) -> dict:
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


def _attendee_in(body: AttendeeIn) -> services.AttendeeIn:
    return services.AttendeeIn(**body.dict())


@attendees.post("", response={200: AttendeeUpsertOut, 201: AttendeeUpsertOut, **errors(409, 422)})
def upsert_attendee(request, body: AttendeeIn):
    """Create or update an attendee, found by this integration's id for them, else by email.
    Fields left out stay as they are."""
    token = _require(request, Scope.ENROLMENTS)
    with transaction.atomic():
        (done,) = services.attendees_upsert(
            integration=token.integration, items=[_attendee_in(body)]
        )
        status = 201 if done.outcome == "created" else 200
        if done.outcome != "unchanged":
            _audit(request, status, attendee=done.attendee.pk, outcome=done.outcome)
    return Status(status, _attendee_out(done.attendee, outcome=done.outcome))


@attendees.get("", response={200: AttendeePage, **errors(422)})
def list_attendees(
    request,
    paging: Query[Paging],
    email: Email | None = None,
    external_id: ExternalId | None = None,
):
    """Attendees by email, filtered by email or this integration's id for them."""
    token = _require(request, Scope.READ)
    rows = Attendee.objects.order_by("email", "pk")
    if email:
        rows = rows.filter(email__iexact=email)
    if external_id:
        rows = rows.filter(
            pk__in=AttendeeRef.objects.filter(
                integration_id=token.integration_id, external_id=external_id
            ).values("attendee_id")
        )
    return _page(rows, paging, _attendee_out)


@attendees.get("/{attendee_id}", response={200: AttendeeOut, **errors(404, 422)})
def get_attendee(request, attendee_id: Path[Id]):
    _require(request, Scope.READ)
    return _attendee_out(_get(Attendee.objects, attendee_id, "attendee"))


# ---- enrolments --------------------------------------------------------------------------

enrolments = Router(tags=["enrolments"])


class EnrolmentIn(Schema):
    workshop: Id | None = Field(None, description="Our id of the workshop.")
    workshop_external_id: ExternalId | None = Field(
        None, description="This integration's id of the workshop, instead."
    )
    attendee: AttendeeIn


class BulkIn(Schema):
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
    attendee_outcome: Literal["created", "updated", "unchanged"]


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


def _upsert(request, items: list[EnrolmentIn]) -> list[services.EnrolmentOutcome]:
    token = _require(request, Scope.ENROLMENTS)
    wanted = [
        services.EnrolmentIn(
            attendee=_attendee_in(item.attendee),
            workshop_id=item.workshop,
            workshop_external_id=item.workshop_external_id,
        )
        for item in items
    ]
    with transaction.atomic():
        results = services.enrolments_upsert(integration=token.integration, items=wanted)
        made = [r.enrolment_id for r in results if r.outcome == "created"]
        touched = [r.attendee_id for r in results if r.attendee_outcome != "unchanged"]
        if made or touched:
            _audit(
                request,
                201 if made else 200,
                enrolments_created=made,
                attendees_changed=sorted(set(touched)),
                items=len(results),
            )
    return results


@enrolments.post("", response={200: EnrolmentResult, 201: EnrolmentResult, **errors(409, 422)})
def create_enrolment(request, body: EnrolmentIn):
    """Enrol an attendee (upserted as POST /api/attendees does). The same enrolment again
    comes back unchanged (200), with no second reminder."""
    (result,) = _upsert(request, [body])
    return Status(201 if result.outcome == "created" else 200, _result_out(result))


@enrolments.post("/bulk", response={200: BulkOut, **errors(409, 413, 422)})
def bulk_enrolments(request, body: BulkIn):
    """Up to 1,000 enrolments, all or nothing: one refused item refuses the request, with
    each item's reason, and nothing is written."""
    results = _upsert(request, body.items)
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
    _require(request, Scope.READ)
    rows = Enrollment.objects.order_by("pk")
    if workshop:
        rows = rows.filter(workshop_id=workshop)
    if attendee:
        rows = rows.filter(attendee_id=attendee)
    if status:
        rows = rows.filter(status=status)
    return _page(rows, paging, _enrolment_out)


@enrolments.get("/{enrolment_id}", response={200: EnrolmentOut, **errors(404, 422)})
def get_enrolment(request, enrolment_id: Path[Id]):
    _require(request, Scope.READ)
    return _enrolment_out(_get(Enrollment.objects, enrolment_id, "enrolment"))


@enrolments.post("/{enrolment_id}/cancel", response={200: EnrolmentOut, **errors(404, 409, 422)})
def cancel_enrolment(request, enrolment_id: Path[Id], body: Reason):
    """Cancel an enrolment with a reason: its unsent reminder is cancelled; recorded as a
    staff decision."""
    token = _require(request, Scope.ENROLMENTS)
    enrolment = _get(Enrollment.objects, enrolment_id, "enrolment")
    if enrolment.status != Enrollment.Status.ACTIVE:
        return problem(
            409, f"Enrolment {enrolment.pk} is already cancelled.", code="already_cancelled"
        )
    result = enrollments_cancel(
        enrollments=Enrollment.objects.filter(pk=enrolment.pk),
        reason=body.reason,
        actor=TokenActor(token),
    )
    _audit(request, 200, enrolment=enrolment.pk, decision=result.audit_id)
    enrolment.refresh_from_db()
    return _enrolment_out(enrolment)


@enrolments.post(
    "/{enrolment_id}/reactivate", response={200: EnrolmentOut, **errors(404, 409, 422)}
)
def reactivate_enrolment(request, enrolment_id: Path[Id]):
    """Enrol a cancelled enrolment's attendee again, explicitly (a re-post never does)."""
    _require(request, Scope.ENROLMENTS)
    enrolment = _get(
        Enrollment.objects.select_related("attendee", "workshop"), enrolment_id, "enrolment"
    )
    if enrolment.status == Enrollment.Status.ACTIVE:
        return problem(409, f"Enrolment {enrolment.pk} is active.", code="already_active")
    with transaction.atomic():
        saved = enrollment_create(attendee=enrolment.attendee, workshop=enrolment.workshop)
        _audit(request, 200, enrolment=saved.pk, outcome="reactivated")
    return _enrolment_out(saved)


# ---- reminders ---------------------------------------------------------------------------

reminders = Router(tags=["reminders"])
ReminderStatus = Literal[tuple(Reminder.Status.values)]  # type: ignore[valid-type]


class NoticeOut(Schema):
    number: int
    kind: str
    status: str
    status_reason: str
    attempts: int
    sent_at: datetime | None
    created_at: datetime


class AttemptOut(Schema):
    number: int
    channel: str
    claimed_at: datetime
    finished_at: datetime | None
    outcome: str
    error: str


class ReminderOut(Schema):
    id: int
    workshop: int
    attendee: int
    enrolment: int
    status: str
    status_reason: str
    attempts: int
    channel: str
    sent_at: datetime | None
    next_attempt_at: datetime | None
    updated_at: datetime
    notices: list[NoticeOut]


class ReminderDetail(ReminderOut):
    history: list[AttemptOut]


class ReminderPage(Schema):
    page: int
    page_size: int
    has_next: bool
    items: list[ReminderOut]


def _notice_out(n: Notice) -> dict:
    return {
        f: getattr(n, f)
        for f in ("number", "kind", "status", "status_reason", "attempts", "sent_at", "created_at")
    }


def _reminder_out(r: Reminder) -> dict:
    return {
        "id": r.pk,
        "workshop": r.workshop_id,
        "attendee": r.attendee_id,
        "enrolment": r.enrollment_id,
        "status": r.status,
        "status_reason": r.status_reason,
        "attempts": r.attempts,
        "channel": r.channel,
        "sent_at": r.sent_at,
        "next_attempt_at": r.next_attempt_at,
        "updated_at": r.updated_at,
        "notices": [_notice_out(n) for n in r.notices.all()],
    }


def _with_notices(rows: QuerySet) -> QuerySet:
    return rows.prefetch_related(Prefetch("notices", queryset=Notice.objects.order_by("number")))


@reminders.get("", response={200: ReminderPage, **errors(422)})
def list_reminders(
    request,
    paging: Query[Paging],
    workshop: Id | None = None,
    attendee: Id | None = None,
    status: ReminderStatus | None = None,
):
    """Reminders with their change notices, filtered by workshop, attendee and status."""
    _require(request, Scope.READ)
    rows = _with_notices(Reminder.objects.order_by("pk"))
    if workshop:
        rows = rows.filter(workshop_id=workshop)
    if attendee:
        rows = rows.filter(attendee_id=attendee)
    if status:
        rows = rows.filter(status=status)
    return _page(rows, paging, _reminder_out)


@reminders.get("/{reminder_id}", response={200: ReminderDetail, **errors(404, 422)})
def get_reminder(request, reminder_id: Path[Id]):
    """One reminder, its notices and each delivery attempt."""
    _require(request, Scope.READ)
    reminder = _get(_with_notices(Reminder.objects), reminder_id, "reminder")
    history = DeliveryAttempt.objects.filter(reminder=reminder).order_by("number")
    return {
        **_reminder_out(reminder),
        "history": [
            {
                "number": a.number,
                "channel": a.channel,
                "claimed_at": a.claimed_at,
                "finished_at": a.finished_at,
                "outcome": a.outcome,
                "error": a.error,
            }
            for a in history
        ],
    }


api.add_router("/workshops", workshops)
api.add_router("/attendees", attendees)
api.add_router("/enrolments", enrolments)
api.add_router("/reminders", reminders)
