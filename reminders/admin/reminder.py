"""Reminders: view-only rows with timeline and message, the health page, replay and resolve."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from clock import default_clock
from reminders.admin.actions import StaffActionsMixin, resolve_effects, resolve_message
from reminders.admin.columns import (
    NulFreeListMixin,
    ViewOnlyMixin,
    format_local,
    format_utc,
    utc_column,
)
from reminders.admin.decision import DecisionFilter
from reminders.admin.forms import ResolveUnknownForm
from reminders.content import language_name, reminder_envelope
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from reminders.selectors import (
    DELIVERY_STATES,
    delivery_state_q,
    reminder_resolve_preview,
    scheduler_health,
    with_delivery_state,
)
from reminders.services.replay import reminder_resolve_unknown
from reminders.trace import trace_lines


class DeliveryAttemptInline(ViewOnlyMixin, admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    fields = (
        "number",
        "channel",
        "worker",
        "claimed_at_utc",
        "finished_at_utc",
        "outcome",
        "provider_calls",
        "error",
        "provider_message_id",
    )
    readonly_fields = fields  # a view-only inline still builds a form of its fields
    ordering = ("number",)
    claimed_at_utc = utc_column("claimed_at", "Claimed")
    finished_at_utc = utc_column("finished_at", "Finished")


class ChannelFilter(admin.AllValuesFieldListFilter):
    """By channel. A reminder no worker has claimed has none: Django would list that as a
    link with no text, which a screen reader reads as nothing but its address."""

    def choices(self, changelist):
        for choice in super().choices(changelist):
            # "" names the empty channel, " (3)" the same with its count (facets shown).
            if choice["display"] == "" or choice["display"].startswith(" ("):
                choice = {**choice, "display": f"None (not claimed yet){choice['display']}"}
            yield choice


class DeadlineFilter(admin.SimpleListFilter):
    title = "deadline"
    parameter_name = "deadline"

    def lookups(self, request, model_admin):
        return [
            ("passed", "Passed"),
            ("hour", "Within the next hour"),
            ("day", "Within the next 24 hours"),
            ("later", "Later than 24 hours"),
        ]

    def queryset(self, request, queryset):
        now = default_clock().now()
        policy = ReminderPolicy.from_settings()

        def by(moment):  # the deadline is at or before ``moment``
            return policy.late_start_q(moment, through="workshop__")

        bounds = {
            "passed": by(now),
            "hour": ~by(now) & by(now + timedelta(hours=1)),
            "day": ~by(now) & by(now + timedelta(days=1)),
            "later": ~by(now + timedelta(days=1)),
        }
        value = self.value()
        return queryset.filter(bounds[value]) if value in bounds else queryset


class DeliveryFilter(admin.SimpleListFilter):
    title = "after it was sent"
    parameter_name = "delivery"

    def lookups(self, request, model_admin):
        return [*DELIVERY_STATES.items(), ("none", "No report from the provider")]

    def queryset(self, request, queryset):
        value = self.value()
        if value in DELIVERY_STATES or value == "none":
            return queryset.filter(delivery_state_q(value))
        return queryset


@admin.register(Reminder)
class ReminderAdmin(NulFreeListMixin, ViewOnlyMixin, StaffActionsMixin, admin.ModelAdmin):
    list_display = (
        "attendee_email",
        "workshop_title",
        "status_value",
        "deadline_local",
        "deadline_utc",
        "attempts",
        "short_error",
        "delivery",
        "provider_message_id",
    )
    list_filter = (
        "status",
        DeliveryFilter,
        ("workshop", admin.RelatedOnlyFieldListFilter),
        DeadlineFilter,
        ("channel", ChannelFilter),
        DecisionFilter,
    )
    search_fields = ("attendee__email", "attendee__name", "workshop__title", "key")
    search_help_text = "Search by attendee email or name, workshop title or reminder key."
    list_select_related = ("attendee", "workshop")
    inlines = [DeliveryAttemptInline]
    actions = ["replay_selected", "resolve_unknown"]
    fieldsets = (
        (None, {"fields": ("attendee", "workshop", "enrollment", "key")}),
        (
            "Status",
            {
                "fields": (
                    "status",
                    "status_reason",
                    "attempts",
                    "last_error",
                    "maybe_sent",
                    "channel",
                    "provider_message_id",
                    "sent_at_utc",
                    "unsubscribed_at_utc",
                )
            },
        ),
        (
            "Timing",
            {
                "fields": (
                    "window_opens_local",
                    "deadline_local",
                    "deadline_utc",
                    "next_attempt_at_utc",
                    "queued_until_utc",
                    "claim_token",
                    "lease_expires_at_utc",
                    "created_at_utc",
                    "updated_at_utc",
                )
            },
        ),
        ("Message", {"fields": ("frozen_text", "message")}),
        ("Timeline", {"fields": ("timeline",)}),
    )

    @admin.display(description="Text")
    def frozen_text(self, obj: Reminder) -> str:
        """Show the text the first claim froze, or that it is not frozen yet."""
        if obj.text_id is None:
            return (
                "Not frozen yet: the first claim fixes the language and text; until then an "
                "edit of the workshop's text changes it."
            )
        text = obj.text
        return format_html(
            "Frozen at the first claim: {}; the subject is {}, the intro {}. Every send under "
            "this key uses it, whatever is edited since.",
            language_name(text.language),
            text.get_subject_source_display(),
            text.get_intro_source_display(),
        )

    @admin.display(description="What it says")
    def message(self, obj: Reminder) -> str:
        """Show the subject and text part as sent, or as they would be sent."""
        envelope = reminder_envelope(reminder=obj, links=False)
        preview = reverse("admin:workshops_workshop_preview", args=[obj.workshop_id])
        changed = ""
        if obj.sent_at and obj.workshop.updated_at > obj.sent_at:
            changed = (
                "The workshop was edited after this was sent: the times and details below "
                "are its current ones. "
            )
        return format_html(
            '<p>{}<a href="{}?{}">Preview with the HTML part and the .ics</a></p>'
            '<p id="reminder-subject"><strong>{}</strong></p>'
            '<pre id="reminder-text" style="white-space: pre-wrap; max-width: 60em">{}</pre>',
            changed,
            preview,
            urlencode({"attendee": obj.attendee_id}),
            envelope.subject,
            envelope.text_body,
        )

    @admin.display(description="What happened (UTC, then the workshop's zone)")
    def timeline(self, obj: Reminder):
        """Show the lines of ``manage.py reminder_trace``, one per event."""
        return format_html(
            '<ol class="reminder-timeline" style="margin:0;padding-left:1.5em">{}</ol>',
            format_html_join(
                "", '<li style="font-family:monospace;white-space:pre-wrap">{}</li>',
                ((line,) for line in trace_lines(obj)),
            ),
        )  # fmt: skip

    def get_queryset(self, request):
        return with_delivery_state(super().get_queryset(request))

    @admin.display(description="After sent", ordering="delivery_at")
    def delivery(self, obj: Reminder) -> str:
        """Show the provider's last report on the message, and when it came."""
        if obj.delivery_kind is None:
            return "-"
        state = (
            f"{obj.delivery_kind}:{obj.delivery_bounce}"
            if obj.delivery_bounce
            else obj.delivery_kind
        )
        return f"{DELIVERY_STATES[state]}, {format_utc(obj.delivery_at)}"

    deadline_utc = utc_column("deadline_at", "Deadline", ordering="workshop__starts_at")
    sent_at_utc = utc_column("sent_at", "Sent at")
    unsubscribed_at_utc = utc_column("unsubscribed_at", "Unsubscribed at")
    next_attempt_at_utc = utc_column("next_attempt_at", "Next attempt")
    queued_until_utc = utc_column("queued_until", "Queued until")
    lease_expires_at_utc = utc_column("lease_expires_at", "Lease expires")
    created_at_utc = utc_column("created_at", "Created")
    updated_at_utc = utc_column("updated_at", "Updated")

    def get_urls(self):
        health = path(
            "health/",
            self.admin_site.admin_view(self.health_view),
            name="reminders_reminder_health",
        )
        return [health, *super().get_urls()]

    def changelist_view(self, request, extra_context=None):
        if request.method == "GET":
            extra_context = {**(extra_context or {}), "health": scheduler_health()}
        return super().changelist_view(request, extra_context)

    def health_view(self, request):
        """Show beat's last publish, the last completed scan, and the counts by state."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        health = scheduler_health()
        changelist = reverse("admin:reminders_reminder_changelist")

        def link(**params) -> str:
            return f"{changelist}?{urlencode(params)}"

        rows = [
            ("Due now, waiting for the next scan", health.due_now, ""),
            ("Queued (message on the broker)", health.queued, link(status__exact="queued")),
            ("Sending (claimed by a worker)", health.sending, link(status__exact="sending")),
            ("Sending with an expired lease (waiting for the reaper)", health.lease_expired, ""),
            ("Failed", health.failed, link(status__exact="failed")),
            ("Unknown outcome (staff must decide)", health.unknown, link(status__exact="unknown")),
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Scheduler health",
            "opts": self.opts,
            "health": health,
            "rows": rows,
            "stale_after_seconds": int(health.stale_after.total_seconds()),
            "interval_seconds": int(health.interval.total_seconds()),
        }
        return TemplateResponse(request, "admin/reminders/reminder/health.html", context)

    @admin.action(description="Replay selected reminders", permissions=["replay"])
    def replay_selected(self, request, queryset):
        """Preview, then re-arm failed (and still on-time missed) reminders and queue them."""
        return self._replay(
            request,
            reminders=queryset,
            action="replay_selected",
            title="Replay reminders",
            intro="the selected reminders",
        )

    def has_resolve_unknown_permission(self, request) -> bool:
        return request.user.has_perm("reminders.resolve_unknown_reminder")

    @admin.action(
        description="Decide reminders of unknown outcome", permissions=["resolve_unknown"]
    )
    def resolve_unknown(self, request, queryset):
        """Ask for a decision and a reason, then mark unknown reminders sent or send them again."""
        return self._reminder_action(
            request,
            ResolveUnknownForm,
            reminders=queryset,
            # Counted for "Mark as sent"; the effect rows count "Send again".
            preview=partial(reminder_resolve_preview, send_again=False),
            effects=resolve_effects,
            run=reminder_resolve_unknown,
            message=resolve_message,
            action="resolve_unknown",
            title="Decide reminders of unknown outcome",
            intro="the selected reminders",
            eligible_label="Of unknown outcome: Mark as sent marks them all sent",
            submit_label="Record the decision",
        )

    @admin.display(description="Status", ordering="status")
    def status_value(self, obj: Reminder) -> str:
        """Show the short status; its full meaning is the tooltip."""
        return format_html('<span title="{}">{}</span>', obj.get_status_display(), obj.status)

    @admin.display(description="Attendee", ordering="attendee__email")
    def attendee_email(self, obj: Reminder) -> str:
        return obj.attendee.email

    @admin.display(description="Workshop", ordering="workshop__title")
    def workshop_title(self, obj: Reminder) -> str:
        return obj.workshop.title

    @admin.display(description="Window opens (workshop's zone)", ordering="workshop__starts_at")
    def window_opens_local(self, obj: Reminder) -> str:
        return format_local(obj.window_opens_at, obj.workshop.zone)

    @admin.display(description="Deadline (workshop's zone)", ordering="workshop__starts_at")
    def deadline_local(self, obj: Reminder) -> str:
        return format_local(obj.deadline_at, obj.workshop.zone)

    @admin.display(description="Last provider error")
    def short_error(self, obj: Reminder) -> str:
        """Show the provider's last error, shortened (never a staff note or status reason)."""
        text = obj.last_error
        if not text:
            return "-"
        return text if len(text) <= 80 else text[:77] + "..."
