"""How the admin shows times and counts: in UTC and in the workshop's own zone, always labelled."""

from __future__ import annotations

from datetime import UTC

from django.contrib import admin

from workshops.models import Enrollment


def has_enrollments(obj) -> bool:
    if obj is None:
        return False
    if isinstance(obj, Enrollment):
        return True
    return obj.enrollments.exists()


def without_bulk_delete(actions: dict) -> dict:
    actions.pop("delete_selected", None)
    return actions


def format_local(moment, zone) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def format_utc(moment) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def utc_column(field: str, label: str):
    """Return an admin display method showing ``field`` in UTC, labelled as such.

    Django shows TIME_ZONE unlabelled; staff compare times across many zones.
    """

    @admin.display(description=f"{label} (UTC)", ordering=field)
    def show(self, obj) -> str:
        return format_utc(getattr(obj, field))

    show.__name__ = f"{field}_utc"
    return show


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def kept_text(frozen: int) -> str:
    if frozen == 1:
        return "1 already claimed keeps the text it was frozen with"
    return f"{frozen} already claimed keep the text they were frozen with"
