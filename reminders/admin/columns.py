"""What the admins share: times labelled UTC or the workshop's zone, counts, view-only rows."""

from __future__ import annotations

from datetime import UTC

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters


class ViewOnlyMixin:
    """Rows the services write and staff only read (Django shows every field read-only)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class NulFreeListMixin:
    """A list whose filter values hold NUL, which PostgreSQL text cannot: Django's answer to a
    filter it cannot apply (back to the whole list), not a 500 on the SQL."""

    def get_changelist_instance(self, request):
        if any("\x00" in key + "".join(values) for key, values in request.GET.lists()):
            raise IncorrectLookupParameters("A filter value holds a NUL character.")
        return super().get_changelist_instance(request)


class KeepEnrolledMixin:
    """Delete only a row nobody enrolled through (enrollments are history), never in bulk."""

    def has_delete_permission(self, request, obj=None) -> bool:
        enrolled = obj is not None and obj.enrollments.exists()
        return super().has_delete_permission(request, obj) and not enrolled

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


def copy_saved(obj, saved) -> None:
    """Give the admin's ``obj`` what a service saved, so it carries on with it."""
    for field in obj._meta.concrete_fields:
        setattr(obj, field.attname, getattr(saved, field.attname))
    obj._state.adding = False
    obj._state.db = saved._state.db


def format_local(moment, zone) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def format_utc(moment) -> str:
    return format_local(moment, UTC)


def utc_column(field: str, label: str, ordering: str = ""):
    """Return a display of ``field`` labelled UTC (Django's is unlabelled; staff mix zones)."""

    @admin.display(description=f"{label} (UTC)", ordering=ordering or field)
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
