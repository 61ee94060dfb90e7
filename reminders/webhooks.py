"""Providers' reports on accepted messages: POST /hooks/http/events (delivery/HTTP_CONTRACT.md)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from clock import default_clock
from reminders.services.feedback import (
    MAX_EVENTS,
    MalformedEvents,
    TooManyEvents,
    delivery_events_record,
    parse_events,
)

# A signature older or newer than this many seconds is refused (a replay).
TIMESTAMP_WINDOW = 300
_SIGNATURE = re.compile(r"sha256=[0-9a-fA-F]{64}")


def callback_signature_valid(
    secret: str, timestamp: str, signature: str, body: bytes, *, now: float
) -> bool:
    """Return whether ``signature`` is ``sha256=`` HMAC-SHA256(``secret``, timestamp LF body),
    with ``timestamp`` (Unix seconds) within TIMESTAMP_WINDOW of ``now``."""
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        return False
    if not _SIGNATURE.fullmatch(signature) or abs(int(timestamp) - now) > TIMESTAMP_WINDOW:
        return False
    message = timestamp.encode() + b"\n" + body
    expected = "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    # Hex in either case: the same digits.
    return hmac.compare_digest(expected.encode(), signature.lower().encode())


def _problem(status: int, title: str, detail: str, **extra) -> JsonResponse:
    """An RFC 9457 problem document."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JsonResponse(body, status=status, content_type="application/problem+json")


@csrf_exempt  # a provider sends no cookie: the signature is the check
@require_POST
def http_events(request: HttpRequest) -> JsonResponse:
    """Record the delivery events the http provider signed; refuse the whole request otherwise."""
    secret = settings.REMINDERS_HTTP_CALLBACK_SECRET
    if not secret:
        raise Http404("REMINDERS_HTTP_CALLBACK_SECRET is not set")
    if (
        "CONTENT_LENGTH" not in request.META
        and "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    ):
        # The WSGI server passes a chunked body on, but Django reads no more than the length.
        return _problem(
            411,
            "Length required",
            "Send the request with a Content-Length header, not chunked. Nothing was recorded.",
        )
    try:
        body = request.body
    except RequestDataTooBig:
        return _problem(
            413,
            "Body too large",
            f"A request carries at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes: split "
            "the events over several requests. Nothing was recorded.",
        )
    signed = callback_signature_valid(
        secret,
        request.headers.get("X-Reminders-Timestamp", ""),
        request.headers.get("X-Reminders-Signature", ""),
        body,
        now=default_clock().now().timestamp(),
    )
    if not signed:
        return _problem(
            401,
            "Signature refused",
            "Sign timestamp LF body with REMINDERS_HTTP_CALLBACK_SECRET (HMAC-SHA256) in "
            f"X-Reminders-Signature, the Unix time in X-Reminders-Timestamp, within "
            f"{TIMESTAMP_WINDOW} s of ours.",
        )
    try:
        events = parse_events(json.loads(body))
    except TooManyEvents:
        return _problem(
            413,
            "Too many events",
            f"A request carries at most {MAX_EVENTS:,} events: split the events over several "
            "requests. Nothing was recorded.",
        )
    except (ValueError, RecursionError) as exc:
        problems = exc.problems if isinstance(exc, MalformedEvents) else ["the body is not JSON"]
        return _problem(
            400,
            "Events refused",
            "Nothing was recorded; fix each problem and send the request again.",
            errors=problems,
        )
    return JsonResponse(delivery_events_record(channel="http", events=events))
