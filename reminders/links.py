"""The attendee's own links in each message: "can't attend" and one-click unsubscribe.

A token is a reminder's id signed with SECRET_KEY (a salt per purpose): deterministic, so a
retry under its key carries the same bytes. It holds no date nor personal data; the server
judges it against the workshop and enrollment as they are now (reminders/attendance.py).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core import signing

_ATTEND = signing.Signer(salt="reminders.attendance", sep=".")
_UNSUBSCRIBE = signing.Signer(salt="reminders.unsubscribe", sep=".")
# A link's path in a log line: the reminder id before the dot stays, the signature after it
# (what acts for the attendee) is masked (config/reporting.py; config/gunicorn.py, the
# access log, has its own copy).
LINK_TOKEN = re.compile(r"(/(?:attend|unsubscribe)/[^/?#\s.]*\.)[^/?#\s\"]+")


def redact_link_tokens(text: str) -> str:
    """Return ``text`` with the signature of every attendee's link in it masked."""
    return LINK_TOKEN.sub(r"\1***", text)


def attendance_token(reminder_id: int) -> str:
    return _ATTEND.sign(str(reminder_id))


def unsubscribe_token(reminder_id: int) -> str:
    return _UNSUBSCRIBE.sign(str(reminder_id))


def reminder_id_from(token: str, *, purpose: str) -> int | None:
    """Return the reminder id a token of ``purpose`` ("attend", "unsubscribe") names, or
    None when it was tampered with or made for another purpose."""
    signer = _ATTEND if purpose == "attend" else _UNSUBSCRIBE
    try:
        value = signer.unsign(token)
    except signing.BadSignature:
        return None
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else None


def attendance_url(reminder_id: int) -> str:
    """Return the reminder's "can't attend" page, or '' when REMINDERS_PUBLIC_URL is blank."""
    base = settings.REMINDERS_PUBLIC_URL
    return f"{base}/attend/{attendance_token(reminder_id)}/" if base else ""


def unsubscribe_url(reminder_id: int) -> str:
    """Return the reminder's one-click unsubscribe address, or '' without REMINDERS_PUBLIC_URL."""
    base = settings.REMINDERS_PUBLIC_URL
    return f"{base}/unsubscribe/{unsubscribe_token(reminder_id)}/" if base else ""
