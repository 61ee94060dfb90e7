"""Field validators shared by models and forms."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from django.core.exceptions import ValidationError


def validate_zone(value: str) -> None:
    """Reject anything that is not an IANA time zone name."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError(
            "%(value)s is not a known time zone; use an IANA name such as Europe/Berlin.",
            code="unknown_zone",
            params={"value": value},
        ) from None


def zone_choices() -> list[tuple[str, str]]:
    """Return every IANA zone as form choices, sorted."""
    return [(name, name) for name in sorted(available_timezones())]


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
