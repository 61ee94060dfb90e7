"""Staff decisions, read-only: every replay, resolution, cancel, reinstate, erasure and test."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from reminders.admin.columns import ViewOnlyMixin, plural, utc_column
from reminders.models import StaffDecision
from reminders.selectors import SKIP_REASONS
from reminders.services.workshop_decisions import WORKSHOP_SKIP_LABELS


@admin.register(StaffDecision)
class StaffDecisionAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = (
        "created_at_utc", "action", "state", "actor_name", "selected", "progress", "changed",
        "queued", "reason",
    )  # fmt: skip
    list_filter = ("action", ("created_at", admin.DateFieldListFilter))
    search_fields = ("actor_name", "reason")
    fields = (
        "created_at_utc",
        "action",
        "state",
        "progress",
        "actor_name",
        "reason",
        "outcome",
        "use_edited_text",
        "selected",
        "changed",
        "queued",
        "skipped_counts",
        "reminders_changed",
        "workshops_changed",
        "attendees_changed",
        "enrollments_changed",
    )
    readonly_fields = fields
    created_at_utc = utc_column("created_at", "Decided")

    @admin.display(description="Skipped")
    def skipped_counts(self, obj: StaffDecision) -> str:
        labels = {**SKIP_REASONS, **WORKSHOP_SKIP_LABELS, "already_erased": "already erased"}
        parts = [f"{count} {labels.get(key, key)}" for key, count in obj.skipped.items() if count]
        return ", ".join(parts) or "-"

    @admin.display(description="Reminders changed")
    def reminders_changed(self, obj: StaffDecision) -> str:
        return _ids_link("admin:reminders_reminder_changelist", obj.reminder_ids, "reminder")

    @admin.display(description="Workshops changed")
    def workshops_changed(self, obj: StaffDecision) -> str:
        return _ids_link("admin:workshops_workshop_changelist", obj.workshop_ids, "workshop")

    @admin.display(description="Attendees erased")
    def attendees_changed(self, obj: StaffDecision) -> str:
        return _ids_link("admin:workshops_attendee_changelist", obj.attendee_ids, "attendee")

    @admin.display(description="Enrollments cancelled")
    def enrollments_changed(self, obj: StaffDecision) -> str:
        return _ids_link("admin:workshops_enrollment_changelist", obj.enrollment_ids, "enrollment")


def _ids_link(changelist: str, ids: list[int], noun: str) -> str:
    """Link to the changelist filtered to ``ids`` (an ``id__in`` lookup), with the count."""
    if not ids:
        return "-"
    url = f"{reverse(changelist)}?{urlencode({'id__in': ','.join(map(str, ids))})}"
    return format_html('<a href="{}">{}</a>', url, plural(len(ids), noun))
