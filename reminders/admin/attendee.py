"""Attendees, with the audited erasure of their personal data."""

from __future__ import annotations

from functools import partial

from django.contrib import admin
from django.db.models import Count, Q

from reminders.admin.actions import StaffActionsMixin
from reminders.admin.columns import KeepEnrolledMixin, NulFreeListMixin, utc_column
from reminders.admin.decision import DecisionFilter
from reminders.admin.forms import AttendeeForm
from reminders.services.erasure import (
    ERASURE_EFFECT_LABELS,
    attendee_erase_preview,
    attendees_erase,
)
from workshops.models import Attendee, Enrollment


@admin.register(Attendee)
class AttendeeAdmin(NulFreeListMixin, KeepEnrolledMixin, StaffActionsMixin, admin.ModelAdmin):
    form = AttendeeForm
    list_display = ("name", "email", "timezone", "enrollment_count", "erased_at_utc")
    list_filter = ("timezone", DecisionFilter)
    search_fields = ("name", "email")
    # Meta.ordering does not order the count's GROUP BY: the autocomplete would page unordered.
    ordering = ("email",)
    actions = ["erase_selected"]
    readonly_fields = ("erased_at_utc",)
    erased_at_utc = utc_column("erased_at", "Erased")

    def get_readonly_fields(self, request, obj=None):
        # An erasure is final: its placeholders can not be edited back into a person.
        if obj is not None and obj.erased_at is not None:
            return ("name", "email", "erased_at_utc")
        return self.readonly_fields

    def get_queryset(self, request):
        active = Count("enrollments", filter=Q(enrollments__status=Enrollment.Status.ACTIVE))
        return super().get_queryset(request).annotate(active_enrollments=active)

    @admin.display(description="Active enrollments", ordering="active_enrollments")
    def enrollment_count(self, obj: Attendee) -> int:
        return obj.active_enrollments

    def has_erase_permission(self, request) -> bool:
        return request.user.has_perm("workshops.erase_attendee")

    @admin.action(description="Erase personal data of selected attendees", permissions=["erase"])
    def erase_selected(self, request, queryset):
        """Preview, ask for a reason, then erase names and emails and cancel enrollments."""
        return self._decision(
            request,
            action="erase_selected",
            preview=partial(attendee_erase_preview, attendees=queryset),
            run=partial(attendees_erase, attendees=queryset),
            effect_labels=ERASURE_EFFECT_LABELS,
            title="Erase personal data of the selected attendees",
            eligible_label="Attendees whose name and email will be erased",
            verb="erase",
            explanation="Names and emails are replaced and cannot be brought back; earlier "
            "errors and staff notes that quote them are cleaned. Reminder rows stay, so "
            "nothing already sent is sent again; history keeps counts and ids only.",
            done="Erased the personal data of {changed}; {reminders} cancelled.",
        )
