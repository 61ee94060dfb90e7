"""The attendee's own pages, reached from the links in their messages; no login.

Only a POST changes anything, so a mail scanner following every link changes nothing. Both POSTs
are verified by the signed token alone, with no cookie (the unsubscribe is RFC 8058 one-click,
which carries none). A bad token, or a workshop ended by its end as it is now, changes nothing.
"""

from __future__ import annotations

import logging
from zoneinfo import ZoneInfo

from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import translation
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from clock import default_clock
from reminders.content import local_start, reminder_language
from reminders.locks import gave_up_waiting
from reminders.services.attendance import (
    enrollment_cancel_by_attendee,
    reminder_for_link,
    reminder_unsubscribe,
)
from workshops.models import Enrollment

logger = logging.getLogger(__name__)

TEMPLATE = "attendance/page.html"
# The attendee's links: their 404 and 500 are this page's too (config/urls.py).
LINK_PATHS = ("/attend/", "/unsubscribe/")


def _page(request: HttpRequest, state: str, reminder=None, *, status: int = 200) -> HttpResponse:
    context = {"state": state}
    # A link that names no reminder names no attendee either: the browser's language then.
    language = translation.get_language_from_request(request)
    if reminder is not None:
        workshop, attendee = reminder.workshop, reminder.attendee
        language = reminder_language(workshop=workshop, attendee=attendee)
        zone = ZoneInfo(attendee.timezone or workshop.timezone)
        context |= {
            "title": workshop.title,
            "when": local_start(workshop.starts_at, zone, language),
            "called_off": not workshop.is_scheduled,
            # The unsubscribe keeps the place, if there is one still to keep.
            "enrolled": reminder.enrollment.status == Enrollment.Status.ACTIVE,
        }
    with translation.override(language):
        response = render(request, TEMPLATE, context | {"language": language}, status=status)
    # no-referrer keeps the token out of every Referer, this site's too: the confirming POST
    # and the browser's /favicon.ico would carry it to a proxy logging referrers. No cache
    # keeps a page: not one naming an attendee's workshop, nor the 404 and 500 (no view's
    # never_cache) in the browser's language, which would then greet every later browser in
    # the first one's.
    response["Referrer-Policy"] = "no-referrer"
    add_never_cache_headers(response)
    if reminder is None:
        patch_vary_headers(response, ("Accept-Language",))
    return response


def _confirm(request: HttpRequest, reminder, change) -> tuple[object, HttpResponse | None]:
    """Run the confirming POST's ``change``; return what it returned, and None or the answer to
    a POST that gave up waiting for a row lock (a worker or staff held it): nothing changed, try
    again. Not the staff pages' redirect (LockBusyMiddleware): that showed the question again
    with no word of why, and lost a mail provider's one-click."""
    try:
        return change(reminder=reminder), None
    except OperationalError as exc:
        if not gave_up_waiting(exc):
            raise
    logger.warning("An attendee's link gave up waiting for a row lock (reminder %s)", reminder.pk)
    response = _page(request, "error", reminder, status=503)
    response["Retry-After"] = "10"
    return None, response


def _usable(request, token: str, purpose: str):
    reminder = reminder_for_link(token, purpose=purpose)
    if reminder is None:
        return None, _page(request, "invalid", status=404)
    if default_clock().now() >= reminder.workshop.ends_at:
        return None, _page(request, "ended", reminder, status=410)
    return reminder, None


# No CSRF check: the signed token in the URL is the authority, not a cookie, so a forged POST
# needs the token itself; the check only refused attendees whose browser keeps no cookies.
# HEAD (a link checker's) answers as GET does, changing nothing.
@csrf_exempt
@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def attend(request: HttpRequest, token: str) -> HttpResponse:
    reminder, refused = _usable(request, token, "attend")
    if refused is not None:
        return refused
    if request.method == "POST":
        cancelled, busy = _confirm(request, reminder, enrollment_cancel_by_attendee)
        if busy is not None:
            return busy
        if cancelled:
            return _page(request, "cancelled", reminder)
    elif reminder.enrollment.status == Enrollment.Status.ACTIVE:
        return _page(request, "ask", reminder)
    # Cancelled before: perhaps by staff, so no thanks for letting us know.
    return _page(request, "was_cancelled", reminder)


@csrf_exempt
@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    reminder, refused = _usable(request, token, "unsubscribe")
    if refused is not None:
        return refused
    if request.method == "POST":
        _, busy = _confirm(request, reminder, reminder_unsubscribe)
        if busy is not None:
            return busy
    elif reminder.unsubscribed_at is None:
        return _page(request, "ask_unsubscribe", reminder)
    return _page(request, "unsubscribed", reminder)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Under an attendee's link, the page a bad token gets; elsewhere Django's own 404."""
    if request.path_info.startswith(LINK_PATHS):
        return _page(request, "invalid", status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """Under an attendee's link, a short page in the browser's language; elsewhere Django's."""
    if request.path_info.startswith(LINK_PATHS):
        return _page(request, "error", status=500)
    return defaults.server_error(request)
