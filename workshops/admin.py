"""Admin for workshops, attendees and enrollments.

Times are shown twice: in the workshop's own zone (what attendees see) and in
UTC (what the scheduler uses), so staff can check the deadline arithmetic.
Writes go through workshops.services, so reminders follow every change.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from workshops.models import Attendee, Enrollment, Workshop


def format_local(moment, zone) -> str:
    """Render an aware datetime in ``zone`` with its abbreviation."""
    if moment is None:
        return "-"
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def format_utc(moment) -> str:
    if moment is None:
        return "-"
    return moment.strftime("%Y-%m-%d %H:%M UTC")


class EnrollmentInline(admin.TabularInline):
    model = Enrollment
    extra = 0
    fields = ("attendee", "status", "created_at")
    readonly_fields = ("created_at",)
    autocomplete_fields = ("attendee",)
    show_change_link = True


@admin.register(Workshop)
class WorkshopAdmin(admin.ModelAdmin):
    list_display = ("title", "start_local", "start_utc", "timezone", "status")
    list_filter = ("status", ("starts_at", admin.DateFieldListFilter), "timezone")
    search_fields = ("title",)
    date_hierarchy = "starts_at"
    inlines = [EnrollmentInline]
    readonly_fields = ("created_at", "updated_at", "start_local", "start_utc")
    fields = (
        "title",
        "starts_at",
        "ends_at",
        "timezone",
        "start_local",
        "start_utc",
        "status",
        "created_at",
        "updated_at",
    )

    @admin.display(description="Start (workshop's zone)", ordering="starts_at")
    def start_local(self, obj: Workshop) -> str:
        return format_local(obj.starts_at, obj.zone) if obj.starts_at else "-"

    @admin.display(description="Start (UTC)", ordering="starts_at")
    def start_utc(self, obj: Workshop) -> str:
        return format_utc(obj.starts_at)


@admin.register(Attendee)
class AttendeeAdmin(admin.ModelAdmin):
    list_display = ("name", "email", "timezone", "enrollment_count")
    search_fields = ("name", "email")
    list_filter = ("timezone",)

    @admin.display(description="Enrollments")
    def enrollment_count(self, obj: Attendee) -> int:
        return obj.enrollments.count()


@admin.register(Enrollment)
class EnrollmentAdmin(admin.ModelAdmin):
    list_display = ("attendee", "workshop_link", "workshop_start", "status", "created_at")
    list_filter = ("status", "workshop__status")
    search_fields = ("attendee__email", "attendee__name", "workshop__title")
    list_select_related = ("attendee", "workshop")
    autocomplete_fields = ("attendee", "workshop")

    @admin.display(description="Workshop", ordering="workshop__title")
    def workshop_link(self, obj: Enrollment) -> str:
        return format_html(
            '<a href="../workshop/{}/change/">{}</a>', obj.workshop_id, obj.workshop.title
        )

    @admin.display(description="Starts (workshop's zone)", ordering="workshop__starts_at")
    def workshop_start(self, obj: Enrollment) -> str:
        return format_local(obj.workshop.starts_at, obj.workshop.zone)
