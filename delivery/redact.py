"""Take secrets out of URLs before they reach an error, a log line or the admin.

A URL's password (``redis://:pw@host``, ``postgres://u:pw@host``) and its
query string (``?token=...``) are credentials as often as not; neither is
needed to tell which endpoint failed. ``redact_url`` keeps scheme, user,
host, port and path, and replaces the password and every query value with
``***``; ``redact_text`` does that to every URL inside a message.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["MASK", "redact_url", "redact_text"]

MASK = "***"
# scheme://anything-but-space-or-quote, as they appear inside error messages.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_QUERY_VALUE = re.compile(r"=([^&;#]*)")


def redact_url(url: str) -> str:
    """Return ``url`` with its password and query values masked (unparseable: masked whole).

    Everything between ``://`` and the last ``@`` is taken as the user info
    before the URL is parsed: a generated password often holds ``/``, ``#``,
    ``?`` or ``@``, which a parser reads as the end of the host
    (``amqp://guest:pa/ss@rabbit//`` would keep its password in the "path").
    An ``@`` in a path or query then costs that part of the URL, never a
    password.
    """
    scheme, separator, rest = url.partition("://")
    userinfo = ""
    if separator and "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
    try:
        parts = urlsplit(f"{scheme}{separator}{rest}")
        netloc = parts.netloc
        if userinfo:
            user, has_password, _ = userinfo.partition(":")
            if has_password and user and not any(c in user for c in "/?#"):
                netloc = f"{user}:{MASK}@{netloc}"
            else:
                # A lone user info may be a token (https://TOKEN@host): masked whole.
                netloc = f"{MASK}@{netloc}" if user else f":{MASK}@{netloc}"
        query = _QUERY_VALUE.sub(f"={MASK}", parts.query) if parts.query else ""
        if parts.query and "=" not in parts.query:
            query = MASK
        return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return MASK


def redact_text(text: str) -> str:
    """Return ``text`` with every URL in it passed through ``redact_url``."""
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
