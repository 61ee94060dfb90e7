"""Admin for reminders: read-only history of what the pipeline did.

Status is never editable by hand: only reminders.services changes it, through
guarded updates. Staff act through admin actions (replay, resolve unknown).
"""

from __future__ import annotations

from django.contrib import admin

from reminders.models import DeliveryAttempt, Reminder
from workshops.admin import format_local, format_utc


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = (
        "number",
        "channel",
        "worker",
        "claimed_at",
        "finished_at",
        "outcome",
        "provider_calls",
        "error",
        "provider_message_id",
    )
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Reminder)
class ReminderAdmin(admin.ModelAdmin):
    list_display = (
        "attendee_email",
        "workshop_title",
        "status",
        "deadline_local",
        "deadline_utc",
        "attempts",
        "short_error",
        "provider_message_id",
    )
    list_filter = ("status", ("deadline_at", admin.DateFieldListFilter), "channel", "workshop")
    search_fields = ("attendee__email", "attendee__name", "workshop__title", "key")
    list_select_related = ("attendee", "workshop")
    inlines = [DeliveryAttemptInline]
    readonly_fields = (
        "attendee",
        "workshop",
        "enrollment",
        "key",
        "status",
        "status_reason",
        "window_opens_at",
        "deadline_at",
        "deadline_local",
        "next_attempt_at",
        "attempts",
        "last_error",
        "queued_until",
        "claim_token",
        "lease_expires_at",
        "channel",
        "provider_message_id",
        "sent_at",
        "created_at",
        "updated_at",
    )
    fields = readonly_fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="Attendee", ordering="attendee__email")
    def attendee_email(self, obj: Reminder) -> str:
        return obj.attendee.email

    @admin.display(description="Workshop", ordering="workshop__title")
    def workshop_title(self, obj: Reminder) -> str:
        return obj.workshop.title

    @admin.display(description="Deadline (workshop's zone)", ordering="deadline_at")
    def deadline_local(self, obj: Reminder) -> str:
        return format_local(obj.deadline_at, obj.workshop.zone)

    @admin.display(description="Deadline (UTC)", ordering="deadline_at")
    def deadline_utc(self, obj: Reminder) -> str:
        return format_utc(obj.deadline_at)

    @admin.display(description="Last error")
    def short_error(self, obj: Reminder) -> str:
        text = obj.last_error or obj.status_reason
        return text if len(text) <= 80 else text[:77] + "..."
