"""The HTTP API under /api/ (django-ninja): workshops, attendees, enrolments, reminders.

Each request carries ``Authorization: Bearer <token>`` (intake.tokens); each
operation needs one scope. Writes go through the same services as the admin
(workshops.services, the staff decisions) and the all-or-nothing intake
(intake.services), and each accepted write leaves an ApiWrite row naming its
token. Errors are RFC 9457 problem documents (intake.problems). One module per
resource; what they share is in intake.api.common.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import OperationalError
from django.http import Http404
from django.shortcuts import render
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, AuthorizationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.openapi.docs import Swagger
from ninja.openapi.views import openapi_json

from intake import services
from intake.api.attendees import attendees
from intake.api.common import TokenAuth
from intake.api.enrolments import enrolments
from intake.api.reminders import reminders
from intake.api.workshops import workshops
from intake.problems import PROBLEM_TYPE, field_errors, problem
from intake.ratelimit import RateLimited
from reminders.locks import lock_not_available


def _docs_behind_admin_login(view):
    """The interactive docs need a staff login; the schema itself is public (it holds no data)."""
    if getattr(view, "func", None) is openapi_json:
        return view
    return staff_member_required(view)


class _Swagger(Swagger):
    """Swagger UI from the served static files, not a CDN: ninja is no installed app here
    (config.settings), and ninja would otherwise take that to mean a CDN."""

    def render_page(self, request, api, **kwargs):
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        # Bearer tokens need no CSRF token (ninja's own test: an auth with ``csrf`` set).
        csrf = any(getattr(auth, "csrf", False) for auth in api.auth or ())
        context = {"swagger_settings": json.dumps(self.settings), "api": api, "add_csrf": csrf}
        return render(request, self.template, context)


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
    docs=_Swagger(),
    docs_url="/docs",
    docs_decorator=_docs_behind_admin_login,
    auth=TokenAuth(),
    urls_namespace="api",
)


@api.exception_handler(NinjaValidationError)
def _invalid(request, exc: NinjaValidationError):
    items = []
    for error in exc.errors:
        where = [str(part) for part in error.get("loc", ()) if part not in ("body", "payload")]
        if where and where[0] in ("query", "path"):
            where = where[1:]
        message = error.get("msg", "Invalid value.").removeprefix("Value error, ")
        ctx = error.get("ctx") or {}
        if error.get("type") == "extra_forbidden":
            message = "No such field here: check its spelling; /api/schema names each field."
        elif error.get("type") in ("too_long", "too_short") and ctx.get("field_type") == "Value":
            # A text measured once stripped (an email, an id): pydantic counts its "items".
            message = (
                f"Ensure this value has at most {ctx['max_length']} characters (it has "
                f"{ctx['actual_length']})."
                if error.get("type") == "too_long"
                else "Give a non-blank value, or leave it out."
            )
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


api.add_router("/workshops", workshops)
api.add_router("/attendees", attendees)
api.add_router("/enrolments", enrolments)
api.add_router("/reminders", reminders)


def no_such_path(request, rest: str = ""):
    """Any other path under /api/: a problem document too, as every API answer that is an error."""
    return problem(
        404, f"The API has no {request.path}; see /api/docs for its paths.", code="not_found"
    )
