"""Staff decisions, read-only: every replay, resolution, cancel, reinstate, erasure and test."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from reminders.admin.columns import NulFreeListMixin, ViewOnlyMixin, plural, utc_column
from reminders.models import Reminder, StaffDecision, id_from_text
from reminders.selectors import SKIP_REASONS
from workshops.models import Attendee, Enrollment, Workshop


class DecisionFilter(admin.SimpleListFilter):
    """The rows a staff decision changed, as its page links to them (``?decision=<id>``).

    Listed only while applied. The link names the decision, not its ids: a thousand ids are
    a request line longer than web (gunicorn) takes.
    """

    title = "staff decision"
    parameter_name = "decision"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, f"Staff decision {value}")] if value else []

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        pk = id_from_text(value)
        if pk is None:
            raise IncorrectLookupParameters("A staff decision is named by its id.")
        field = f"{queryset.model._meta.model_name}_ids"
        ids = StaffDecision.objects.filter(pk=pk).values_list(field, flat=True).first()
        return queryset.filter(pk__in=ids or [])


def ids_column(model, label: str):
    """Return a display of the decision's ``<model>_ids``: their count, linked to their list."""
    opts = model._meta

    @admin.display(description=label)
    def show(self, obj: StaffDecision) -> str:
        ids = getattr(obj, f"{opts.model_name}_ids")
        if not ids:
            return "-"
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        url = f"{changelist}?{urlencode({DecisionFilter.parameter_name: obj.pk})}"
        return format_html('<a href="{}">{}</a>', url, plural(len(ids), opts.verbose_name))

    return show


# What each skip a staff decision records means (keys from the services' skipped_as, and the
# ticked ids gone meanwhile), in the order staff read them.
DECISION_SKIPS = {
    "already_cancelled": "already cancelled",
    "not_cancelled": "not cancelled",
    "nothing_to_tell": "with no reminded attendee to tell of a change",
    **SKIP_REASONS,
    "already_erased": "already erased",
    "already_lifted": "already lifted",
    "workshops_not_found": "selected workshops no longer exist",
    "enrollments_not_found": "selected enrollments no longer exist",
    "attendees_not_found": "selected attendees no longer exist",
}


@admin.register(StaffDecision)
class StaffDecisionAdmin(NulFreeListMixin, ViewOnlyMixin, admin.ModelAdmin):
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
    created_at_utc = utc_column("created_at", "Decided")
    reminders_changed = ids_column(Reminder, "Reminders changed")
    workshops_changed = ids_column(Workshop, "Workshops changed")
    attendees_changed = ids_column(Attendee, "Attendees erased")
    enrollments_changed = ids_column(Enrollment, "Enrollments cancelled")

    @admin.display(description="Skipped")
    def skipped_counts(self, obj: StaffDecision) -> str:
        parts = [
            f"{count} {DECISION_SKIPS.get(key, key)}" for key, count in obj.skipped.items() if count
        ]
        return ", ".join(parts) or "-"
