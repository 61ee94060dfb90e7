"""Mask passwords and query values in URLs before they reach errors and logs."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["MASK", "redact_url", "redact_text"]

MASK = "***"
# A URL ends at a quote (it is often quoted), but not in its user info, where a password
# may hold one: that runs to the last "@" before a space.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^\s<>]*@)?[^\s'\"<>]+")
_QUERY_VALUE = re.compile(r"=([^&;#]*)")


def redact_url(url: str) -> str:
    """Return ``url`` with its password and query values masked.

    User info runs to the last ``@``, as a password may hold ``/``, ``?``, ``#`` or ``@``;
    an unparseable URL is masked whole.
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
                # A lone user info may be a token (https://TOKEN@host).
                netloc = f"{MASK}@{netloc}" if user else f":{MASK}@{netloc}"
        query = _QUERY_VALUE.sub(f"={MASK}", parts.query)
        if parts.query and "=" not in parts.query:
            query = MASK
        return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return MASK


def redact_text(text: str) -> str:
    """Return ``text`` with every URL in it redacted."""
    if "://" not in text:
        return text  # the common case, a log line or an outcome without a URL
    return _URL.sub(lambda match: redact_url(match.group(0)), text)
