"""What every part of the API shares: input types, the token, its scope and audit, paging."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated, Literal

from django.conf import settings
from django.db.models import QuerySet
from django.http import Http404
from ninja import Field, Schema
from ninja.errors import AuthorizationError
from ninja.security import HttpBearer
from pydantic import AfterValidator, BeforeValidator, ConfigDict

from clock import default_clock
from intake.models import ApiToken, ApiWrite
from intake.problems import Problem
from intake.ratelimit import rate_check
from intake.tokens import TOKEN_PREFIX, shown_prefix, token_authenticate

logger = logging.getLogger(__name__)

Scope = ApiToken.Scope
MAX_ID = 2**63 - 1  # BigAutoField
MAX_PAGE = 100_000


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


def _stripped(value):
    return value.strip() if isinstance(value, str) else value


# Stripped, as the admin's form strips it: a title of spaces alone is none.
Title = Annotated[Text, BeforeValidator(_stripped)]
# Stripped, as the intake strips an attendee's: ' c-7 ' and 'c-7' are one id.
ExternalId = Annotated[Text, BeforeValidator(_stripped), Field(min_length=1, max_length=200)]

Email = Annotated[
    Text, BeforeValidator(_stripped), Field(max_length=254, json_schema_extra={"format": "email"})
]
LANGUAGES = tuple(code for code, _ in settings.LANGUAGES)
Language = Literal[LANGUAGES]  # type: ignore[valid-type]
AttendeeLanguage = Literal[("", *LANGUAGES)]  # type: ignore[valid-type]


class Input(Schema):
    """A request body: a field it does not name is refused, not dropped (a misspelt field
    would otherwise answer 200 with nothing of it done)."""

    model_config = ConfigDict(extra="forbid")


class TokenAuth(HttpBearer):
    def authenticate(self, request, token: str) -> ApiToken | None:
        found = token_authenticate(token)
        if found is None:
            # Not limited: a 256-bit secret cannot be guessed, and behind a proxy a lockout by
            # address would shut out every integration. Ops see who sends a wrong one.
            shown = shown_prefix(token) if token.startswith(TOKEN_PREFIX) else "?"
            logger.warning(
                "API token refused (unknown, malformed or revoked): %s from %s",
                shown,
                request.META.get("REMOTE_ADDR", "?"),
            )
        else:
            rate_check(found)
        return found


def require(request, scope: str) -> ApiToken:
    token: ApiToken = request.auth
    if scope not in token.scopes:
        raise AuthorizationError(
            message=f"This token may not do this: it needs the '{scope}' scope, and has "
            f"{', '.join(token.scopes) or 'none'}. Create a token with that scope."
        )
    return token


def audit(request, status: int, **summary) -> None:
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


def audit_decision(request, **summary):
    """The ``also`` of a staff decision: its API write, in its transaction, if it changed
    anything (neither is kept without the other)."""

    def also(result) -> None:
        if result.changed:
            audit(request, 200, **summary, decision=result.audit_id, reminders=result.reminders)

    return also


class TokenActor:
    """A token standing where a staff member would in a StaffDecision: named, without a user."""

    pk = None

    def __init__(self, token: ApiToken) -> None:
        self.token = token

    def get_username(self) -> str:
        return self.token.label[:150]


def errors(*statuses: int) -> dict:
    return {s: Problem for s in (401, 403, 429, 503, *statuses)}


def get_or_404(queryset: QuerySet, pk: int, what: str):
    found = queryset.filter(pk=pk).first()
    if found is None:
        raise Http404(f"No {what} has id {pk}.")
    return found


class Paging(Schema):
    page: int = Field(1, ge=1, le=MAX_PAGE)
    page_size: int = Field(100, ge=1, le=500)


def page_of(queryset: QuerySet, paging: Paging, convert) -> dict:
    start = (paging.page - 1) * paging.page_size
    rows = list(queryset[start : start + paging.page_size + 1])
    return {
        "page": paging.page,
        "page_size": paging.page_size,
        "has_next": len(rows) > paging.page_size,
        "items": [convert(row) for row in rows[: paging.page_size]],
    }


class Reason(Input):
    reason: Text = Field(
        description="Why; recorded with the decision, and told to attendees of a cancelled workshop."
    )
