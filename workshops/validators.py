"""Field validators shared by models and forms."""

from __future__ import annotations

from functools import cache
from zoneinfo import available_timezones

from django.core.exceptions import ValidationError


@cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones())


@cache
def _by_lower() -> dict[str, str]:
    return {name.lower(): name for name in _zones()}


def validate_zone(value: str) -> None:
    """Reject anything that is not an IANA time zone name: the names the admin offers.

    Not merely what ``ZoneInfo`` opens: it opens ``posix/...`` and ``right/...``
    files too, and raises ``IsADirectoryError`` for a folder such as ``Europe``.
    """
    if value not in _zones():
        meant = _by_lower().get(value.strip().lower())  # 'europe/berlin', ' Europe/Berlin '
        raise ValidationError(
            f"%(value)s is not a known time zone; write it exactly as {meant}."
            if meant
            else "%(value)s is not a known time zone; use an IANA name such as Europe/Berlin.",
            code="unknown_zone",
            params={"value": value},
        )


def zone_choices() -> list[tuple[str, str]]:
    """Return every IANA zone as form choices, sorted."""
    return [(name, name) for name in sorted(_zones())]


def validate_join_url(value: str) -> None:
    """Accept only https join links.

    Attendees open the link from their mail; an http link would carry their
    session with the meeting service in the clear.
    """
    if not value or value.lower().startswith("https://"):
        return
    raise ValidationError(
        "The join link must start with https:// (got %(value)s); paste the meeting's https link.",
        code="insecure_join_url",
        params={"value": value[:80]},
    )
