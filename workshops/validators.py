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
