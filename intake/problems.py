"""Errors as RFC 9457 problem documents (``application/problem+json``), one shape everywhere."""

from __future__ import annotations

import json

from django.http import HttpResponse
from ninja import Schema

PROBLEM_TYPE = "application/problem+json"


class ProblemItem(Schema):
    field: str
    detail: str
    code: str
    index: int | None = None


class Problem(Schema):
    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    errors: list[ProblemItem] = []


TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    503: "Service Unavailable",
}


def problem(
    status: int,
    detail: str,
    *,
    code: str,
    errors: list[dict] | None = None,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    body = {
        "type": "about:blank",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        "errors": errors or [],
    }
    response = HttpResponse(json.dumps(body), status=status, content_type=PROBLEM_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def field_errors(error_dict: dict[str, list[str]]) -> list[dict]:
    """A Django ValidationError's ``message_dict`` as problem items."""
    return [
        {
            "field": ("" if name == "__all__" else name) or "body",
            "detail": m,
            "code": "invalid",
        }
        for name, messages in error_dict.items()
        for m in messages
    ]
