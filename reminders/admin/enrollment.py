"""Enrollments: made via workshops.services, cancelled only by the audited action, never deleted."""

from __future__ import annotations

from functools import partial

from django.conf import settings
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from reminders.admin.actions import StaffActionsMixin
from reminders.admin.columns import (
    NulFreeListMixin,
    copy_saved,
    format_local,
    plural,
    utc_column,
)
from reminders.admin.decision import DecisionFilter
from reminders.admin.forms import EnrollmentForm
from reminders.models import Reminder
from reminders.services.enrollment_decisions import enrollment_cancel_preview, enrollments_cancel
from reminders.services.notices import notices_told_count
from reminders.services.workshop_decisions import EFFECT_LABELS
from workshops.models import Enrollment
from workshops.services import enrollment_create


def say_what_follows(model_admin, request, enrollments: list[int]) -> None:
    """Say who of ``enrollments`` just made active hears it is back on (they were told it was
    cancelled); warn that those made missed get no reminder (the start is too near)."""
    told = notices_told_count(enrollments=enrollments, cancelled=False)
    if told:
        model_admin.message_user(
            request,
            "The attendee was told this enrollment is cancelled: they will get a change notice "
            "that it is active again."
            if told == 1 and len(enrollments) == 1
            else f"{plural(told, 'attendee')} told their enrollment was cancelled will get a "
            "change notice that it is active again.",
            messages.INFO,
        )
    late = (Reminder.Status.MISSED, Reminder.Status.UNKNOWN)
    count = Reminder.objects.filter(enrollment__in=enrollments, status__in=late).count()
    if not count:
        return
    who = "This enrollment gets" if count == 1 else f"{count} enrollments get"
    model_admin.message_user(
        request,
        f"{who} no reminder: the workshop starts less than the cutoff "
        f"({plural(settings.REMINDERS_CUTOFF_MINUTES, 'minute')}) from now. Tell the "
        f"attendee{'' if count == 1 else 's'} another way.",
        messages.WARNING,
    )


@admin.register(Enrollment)
class EnrollmentAdmin(NulFreeListMixin, StaffActionsMixin, admin.ModelAdmin):
    form = EnrollmentForm
    actions = ["cancel_selected"]
    list_display = ("attendee", "workshop_link", "workshop_start", "status", "created_at_utc")
    list_filter = ("status", "workshop__status", DecisionFilter)
    search_fields = ("attendee__email", "attendee__name", "workshop__title")
    list_select_related = ("attendee", "workshop")
    autocomplete_fields = ("attendee", "workshop")
    created_at_utc = utc_column("created_at", "Enrolled")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_readonly_fields(self, request, obj=None):
        # To move someone, cancel this enrollment and enrol them elsewhere.
        return ("attendee", "workshop", "created_at_utc") if obj else ("created_at_utc",)

    def save_model(self, request, obj: Enrollment, form, change: bool) -> None:
        """Enrol, or enrol again, through enrollment_create (the form refuses a cancel)."""
        if change and "status" not in form.changed_data:
            return
        copy_saved(obj, enrollment_create(attendee=obj.attendee, workshop=obj.workshop))
        say_what_follows(self, request, [obj.pk])

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("workshops.cancel_enrollment")

    @admin.action(description="Cancel selected enrollments", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        """Preview, ask for a reason, then cancel the enrollments and their unsent reminders."""
        return self._decision(
            request,
            action="cancel_selected",
            preview=partial(enrollment_cancel_preview, enrollments=queryset),
            run=partial(enrollments_cancel, enrollments=queryset),
            effect_labels=EFFECT_LABELS,
            title="Cancel the selected enrollments",
            eligible_label="Active enrollments that will be cancelled",
            verb="cancel",
            explanation="A cancelled enrollment gets no reminder; an attendee already reminded "
            "gets a change notice saying it is cancelled. To enrol the attendee again, "
            "set the enrollment back to active: its reminder is planned again unless the "
            "cutoff has passed; one already sent is never sent twice.",
            done="Cancelled {changed}; {reminders} cancelled.",
        )

    @admin.display(description="Workshop", ordering="workshop__title")
    def workshop_link(self, obj: Enrollment) -> str:
        url = reverse("admin:workshops_workshop_change", args=[obj.workshop_id])
        return format_html('<a href="{}">{}</a>', url, obj.workshop.title)

    @admin.display(description="Starts (workshop's zone)", ordering="workshop__starts_at")
    def workshop_start(self, obj: Enrollment) -> str:
        return format_local(obj.workshop.starts_at, obj.workshop.zone)
