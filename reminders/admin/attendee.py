"""Attendees, with the audited erasure of their personal data."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, Q

from reminders.admin.actions import StaffActionsMixin, confirmed_form
from reminders.admin.columns import KeepEnrolledMixin, plural, utc_column
from reminders.admin.forms import AttendeeForm, ReasonForm
from reminders.services.erasure import attendee_erase_preview, attendees_erase
from workshops.models import Attendee, Enrollment


@admin.register(Attendee)
class AttendeeAdmin(KeepEnrolledMixin, StaffActionsMixin, admin.ModelAdmin):
    form = AttendeeForm
    list_display = ("name", "email", "timezone", "enrollment_count", "erased_at_utc")
    list_filter = ("timezone",)
    search_fields = ("name", "email")
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
        form = confirmed_form(request, ReasonForm)
        if form.is_valid():
            result = attendees_erase(
                attendees=queryset, reason=form.cleaned_data["reason"], actor=request.user
            )
            self.message_user(
                request,
                f"Erased the personal data of {plural(result.erased, 'attendee')}; "
                f"{plural(result.reminders_cancelled, 'reminder')} cancelled. "
                "The decision is recorded.",
                messages.SUCCESS if result.erased else messages.WARNING,
            )
            return None
        counted = attendee_erase_preview(attendees=queryset)
        skipped = counted.selected - counted.eligible
        return self._confirmation_page(
            request,
            "workshop_decision_confirmation.html",
            title="Erase personal data of the selected attendees",
            action="erase_selected",
            explanation="Names and emails are replaced and cannot be brought back; earlier "
            "errors and staff notes that quote them are cleaned. Reminder rows stay, so "
            "nothing already sent is sent again; history keeps counts and ids only.",
            preview=counted,
            eligible_label="Attendees whose name and email will be erased",
            effect_rows=[
                ("Active enrollments that will be cancelled", counted.enrollments),
                ("Reminders that will be cancelled", counted.reminders_to_cancel),
                ("Reminders already sent (kept, so never sent again)", counted.reminders_sent),
            ],
            skipped_rows=[("already erased", skipped)] if skipped else [],
            submit_label=f"Yes, erase {plural(counted.eligible, 'attendee')}",
            form=form,
        )
