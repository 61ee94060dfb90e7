"""Enrollments: created and cancelled through workshops.services, never deleted."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from reminders.admin.columns import (
    format_local,
    utc_column,
)
from reminders.admin.forms import (
    EnrollmentForm,
)
from workshops.models import Enrollment
from workshops.services import (
    enrollment_cancel,
    enrollment_create,
)


@admin.register(Enrollment)
class EnrollmentAdmin(admin.ModelAdmin):
    form = EnrollmentForm
    list_display = ("attendee", "workshop_link", "workshop_start", "status", "created_at_utc")
    list_filter = ("status", "workshop__status")
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
        """Save through enrollment_create / enrollment_cancel, never ``obj.save()``."""
        if not change:
            saved = enrollment_create(attendee=obj.attendee, workshop=obj.workshop)
            if obj.status == Enrollment.Status.CANCELLED:
                saved = enrollment_cancel(enrollment=saved)
        elif "status" not in form.changed_data:
            return
        elif obj.status == Enrollment.Status.CANCELLED:
            saved = enrollment_cancel(enrollment=obj)
        else:
            saved = enrollment_create(attendee=obj.attendee, workshop=obj.workshop)
        for model_field in Enrollment._meta.concrete_fields:
            setattr(obj, model_field.attname, getattr(saved, model_field.attname))
        obj._state.adding = False

    @admin.display(description="Workshop", ordering="workshop__title")
    def workshop_link(self, obj: Enrollment) -> str:
        url = reverse("admin:workshops_workshop_change", args=[obj.workshop_id])
        return format_html('<a href="{}">{}</a>', url, obj.workshop.title)

    @admin.display(description="Starts (workshop's zone)", ordering="workshop__starts_at")
    def workshop_start(self, obj: Enrollment) -> str:
        return format_local(obj.workshop.starts_at, obj.workshop.zone)
