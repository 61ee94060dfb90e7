"""Admin for reminders: what the pipeline did, scheduler health, and the staff decisions.

Status is never editable by hand: reminders are view-only here, and only
services change a status, through guarded UPDATEs. Staff act through admin
actions, each behind its own permission and a confirmation page that
previews the outcome:

- "Replay selected reminders" (and "Replay reminders for selected workshops"
  on workshops), permission ``reminders.replay_reminder``;
- "Decide reminders of unknown outcome", permission
  ``reminders.resolve_unknown_reminder``, with a required reason;
- "Cancel selected workshops" and "Reinstate selected workshops", permission
  ``workshops.cancel_workshop``, with a required reason
  (reminders.workshop_actions).

Every decision writes one StaffDecision row, listed read-only under "Staff
decisions" with links to the reminders and workshops it changed.

A selection is never loaded row by row: the action receives the changelist's
queryset (``pk IN (...)`` of the ticked ids, or every row matching the
filters when "select all" was used) and reminders.replay turns it into one
aggregate and one guarded UPDATE. The confirmation form posts back the same
ticked ids, the same ``select_across`` flag and, through its URL, the same
filters, so confirming acts on the selection that was previewed. A POST
naming an action the user may not run gets 403 before anything is read.

This module also extends workshops.admin.WorkshopAdmin (the workshops app
never imports reminders) with reminder counts and the workshop decisions.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.timesince import timesince

from clock import default_clock
from reminders.content import language_name, reminder_envelope, reminder_preview
from reminders.erasure import attendee_erase_preview, attendees_erase
from reminders.models import DeliveryAttempt, Reminder, StaffDecision
from reminders.policy import ReminderPolicy
from reminders.replay import (
    REASON_MAX_LENGTH,
    StaffActionResult,
    reminder_replay,
    reminder_replay_later,
    reminder_resolve_unknown,
)
from reminders.selectors import (
    SKIP_REASONS,
    SelectionPreview,
    reminder_replay_preview,
    reminder_resolve_preview,
    scheduler_health,
    selection_of,
    workshop_text_reach,
)
from reminders.testsend import NOT_ENROLLED, reminder_send_test_request
from reminders.trace import trace_lines
from reminders.workshop_actions import (
    WORKSHOP_EFFECT_LABELS,
    WORKSHOP_SKIP_LABELS,
    WorkshopDecisionResult,
    WorkshopPreview,
    workshop_cancel_preview,
    workshop_reinstate_preview,
    workshops_cancel,
    workshops_reinstate,
)
from workshops.admin import AttendeeAdmin as BaseAttendeeAdmin
from workshops.admin import WorkshopAdmin as BaseWorkshopAdmin
from workshops.admin import format_local, format_utc, utc_column
from workshops.models import Attendee, Enrollment, Workshop
from workshops.services import TEXT_FIELDS

Status = Reminder.Status
CONFIRM = "post"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _kept(frozen: int) -> str:
    if frozen == 1:
        return "1 already claimed keeps the text it was frozen with"
    return f"{frozen} already claimed keep the text they were frozen with"


# Why selected items were left alone, in the order staff read them.
SKIP_LABELS = {**SKIP_REASONS, "workshops_not_found": "selected workshops no longer exist"}


def skipped_text(skipped: dict[str, int]) -> str:
    """Return " Skipped: 2 already sent, 1 past the cutoff." in SKIP_LABELS order, or ""."""
    parts = [f"{skipped[key]} {label}" for key, label in SKIP_LABELS.items() if skipped.get(key)]
    return f" Skipped: {', '.join(parts)}." if parts else ""


def replay_message(result: StaffActionResult, *, not_found: dict[str, int]) -> str:
    """Return the message staff read after a replay: what was queued and what was left alone."""
    skipped = {**result.skipped, **not_found}
    if result.running:
        url = reverse("admin:reminders_staffdecision_change", args=[result.audit_id])
        return format_html(
            "Replaying {} in the background: a worker re-arms and queues them in chunks. "
            'Follow its progress and final counts in <a href="{}">staff decision {}</a>.{}',
            _plural(result.selected, "selected reminder"),
            url,
            result.audit_id,
            skipped_text(skipped),
        )
    if not result.changed:
        return "Nothing was replayed." + skipped_text(skipped)
    text = f"Replayed {_plural(result.changed, 'reminder')}: {result.queued} queued for delivery"
    if result.later:
        text += f", {result.later} queued by the next scan"
    if result.waiting:
        text += f", {result.waiting} waiting for their send window"
    return text + "." + skipped_text(skipped)


def resolve_message(result: StaffActionResult, *, not_found: dict[str, int]) -> str:
    """Return the message staff read after deciding reminders of unknown outcome."""
    skipped = {**result.skipped, **not_found}
    if not result.changed:
        return "No reminder was changed." + skipped_text(skipped)
    if result.action == StaffDecision.Action.MARK_SENT:
        text = f"Marked {_plural(result.changed, 'reminder')} as sent"
    else:
        text = f"Sending {_plural(result.changed, 'reminder')} again: {result.queued} queued"
        if result.later:
            text += f", {result.later} queued by the next scan"
        if result.waiting:
            text += f", {result.waiting} waiting for their send window"
    return text + "." + skipped_text(skipped)


class ReplayForm(forms.Form):
    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        max_length=REASON_MAX_LENGTH,
        help_text="Optional; recorded with the replay.",
    )
    use_edited_text = forms.BooleanField(
        required=False,
        label="Use the edited text",
        help_text="Off: each reminder sends the text it was frozen with when first claimed, "
        "the same as before. On: it takes the workshop's text as it is now. Recorded with "
        "the replay.",
    )


class ResolveUnknownForm(forms.Form):
    decision = forms.ChoiceField(
        label="Decision",
        choices=[
            (StaffDecision.Action.MARK_SENT, "Mark as sent: the attendee received it"),
            (
                StaffDecision.Action.SEND_AGAIN,
                "Send again: re-arm and deliver (the attendee may receive it twice)",
            ),
        ],
        widget=forms.RadioSelect,
        error_messages={"required": "Choose 'mark as sent' or 'send again'."},
    )
    reason = forms.CharField(
        label="Reason",
        max_length=REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded with the decision, e.g. 'provider log shows it was delivered'.",
        error_messages={"required": "Give a reason: it is recorded with the decision."},
    )


class StaffActionsMixin:
    """Confirmation pages, permission checks and id validation for staff actions on a changelist."""

    def has_replay_permission(self, request) -> bool:
        return request.user.has_perm("reminders.replay_reminder")

    def has_resolve_unknown_permission(self, request) -> bool:
        return request.user.has_perm("reminders.resolve_unknown_reminder")

    def changelist_view(self, request, extra_context=None):
        if request.method == "POST":
            self._refuse_forbidden_action(request)
        return super().changelist_view(request, extra_context)

    def _refuse_forbidden_action(self, request) -> None:
        """Raise PermissionDenied for a POST naming an action the user may not run.

        Django would only answer "No action selected." (the action is not in
        the user's choices); a forged request deserves a 403.
        """
        for name in request.POST.getlist("action"):
            func = getattr(self, name, None) if name in (self.actions or ()) else None
            needed = getattr(func, "allowed_permissions", ())
            if needed and not any(
                getattr(self, f"has_{permission}_permission")(request) for permission in needed
            ):
                raise PermissionDenied

    def response_action(self, request, queryset):
        invalid = [
            value
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            if not (value.isascii() and value.isdigit() and 0 < int(value) < 2**63)
        ]
        if invalid:
            shown = ", ".join(repr(value[:20]) for value in invalid[:3])
            self.message_user(
                request,
                f"The selection held values that are not ids ({shown}); nothing was changed. "
                "Select the items again.",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset)

    def _selection_state(self, request) -> dict:
        return {
            "selected_ids": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") in ("1", "True", "true", "on"),
        }

    def _missing(self, request, *, found: int, key: str = "not_found") -> dict[str, int]:
        """Return how many ticked ids matched nothing, as a skip count (none with "select all")."""
        state = self._selection_state(request)
        if state["select_across"]:
            return {}
        missing = len(set(state["selected_ids"])) - found
        return {key: missing} if missing > 0 else {}

    def _confirmation(
        self,
        request,
        *,
        action: str,
        title: str,
        intro: str,
        preview: SelectionPreview,
        missing: dict[str, int],
        eligible_label: str,
        submit_label: str,
        form: forms.Form | None = None,
    ) -> TemplateResponse:
        skipped = {**preview.skipped, **missing}
        rows = [(label, skipped[key]) for key, label in SKIP_LABELS.items() if skipped.get(key)]
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "media": self.media + (form.media if form is not None else forms.Media()),
            "action": action,
            "intro": intro,
            "preview": preview,
            "eligible_label": eligible_label,
            "submit_label": submit_label,
            "skipped_rows": rows,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirm_field": CONFIRM,
            "changelist_url": request.get_full_path(),
            **self._selection_state(request),
        }
        return TemplateResponse(request, "admin/reminders/staff_action_confirmation.html", context)

    def _decision_page(
        self,
        request,
        *,
        title: str,
        action: str,
        noun: str,
        explanation: str,
        preview,
        eligible_label: str,
        effect_rows: list[tuple[str, int]],
        skipped_rows: list[tuple[str, int]],
        submit_label: str,
        form: forms.Form,
    ) -> TemplateResponse:
        """Render the confirmation of a decision on workshops or attendees, with its reason."""
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "media": self.media + form.media,
            "action": action,
            "noun": noun,
            "explanation": explanation,
            "preview": preview,
            "eligible_label": eligible_label,
            "effect_rows": effect_rows,
            "skipped_rows": skipped_rows,
            "submit_label": submit_label,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirm_field": CONFIRM,
            "changelist_url": request.get_full_path(),
            **self._selection_state(request),
        }
        return TemplateResponse(
            request, "admin/reminders/workshop_decision_confirmation.html", context
        )

    def _replay(
        self,
        request,
        *,
        reminders: QuerySet[Reminder],
        action: str,
        title: str,
        intro: str,
        missing: dict[str, int] | None = None,
    ):
        """Preview a replay on a confirmation page, or run it once confirmed.

        ``missing`` counts ticked ids that matched nothing; None means they
        are reminder ids, counted from the preview without another query.
        """
        confirming = request.POST.get(CONFIRM) == "yes"
        form = ReplayForm(request.POST if confirming else None)
        if not confirming or not form.is_valid():
            preview = reminder_replay_preview(reminders=reminders)
            if missing is None:
                missing = self._missing(request, found=preview.selected)
            return self._confirmation(
                request,
                action=action,
                title=title,
                intro=intro,
                preview=preview,
                missing=missing,
                eligible_label="Will be queued for delivery again",
                submit_label=f"Yes, replay {_plural(preview.eligible, 'reminder')}",
                form=form,
            )
        options = {
            "reason": form.cleaned_data["reason"],
            "use_edited_text": form.cleaned_data["use_edited_text"],
        }
        if selection_of(reminders).count() > settings.REMINDERS_REPLAY_INLINE_LIMIT:
            result = reminder_replay_later(reminders=reminders, actor=request.user, **options)
        else:
            result = reminder_replay(reminders=reminders, actor=request.user, **options)
        if missing is None:
            missing = self._missing(request, found=result.selected)
        self.message_user(
            request,
            replay_message(result, not_found=missing),
            messages.SUCCESS if result.changed or result.running else messages.WARNING,
        )
        return None


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
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
    readonly_fields = fields
    ordering = ("number",)
    claimed_at_utc = utc_column("claimed_at", "Claimed")
    finished_at_utc = utc_column("finished_at", "Finished")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


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

        def by(moment):  # the deadline is at or before ``moment``: judged on the start
            return policy.late_start_q(moment, through="workshop__")

        bounds = {
            "passed": by(now),
            "hour": ~by(now) & by(now + timedelta(hours=1)),
            "day": ~by(now) & by(now + timedelta(days=1)),
            "later": ~by(now + timedelta(days=1)),
        }
        value = self.value()
        return queryset.filter(bounds[value]) if value in bounds else queryset


@admin.register(Reminder)
class ReminderAdmin(StaffActionsMixin, admin.ModelAdmin):
    list_display = (
        "attendee_email",
        "workshop_title",
        "status_value",
        "deadline_local",
        "deadline_utc",
        "attempts",
        "short_error",
        "provider_message_id",
    )
    list_filter = (
        "status",
        ("workshop", admin.RelatedOnlyFieldListFilter),
        DeadlineFilter,
        "channel",
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
    readonly_fields = tuple(name for _, options in fieldsets for name in options["fields"])

    @admin.display(description="Text")
    def frozen_text(self, obj: Reminder) -> str:
        """The language and text the first claim froze, or that it would freeze now."""
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
        """The subject and text part as sent (or as they would be sent), from the frozen text."""
        envelope = reminder_envelope(reminder=obj)
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
        """The same lines as ``manage.py reminder_trace``, one per event."""
        return format_html(
            '<ol class="reminder-timeline" style="margin:0;padding-left:1.5em">{}</ol>',
            format_html_join(
                "", '<li style="font-family:monospace;white-space:pre-wrap">{}</li>',
                ((line,) for line in trace_lines(obj)),
            ),
        )  # fmt: skip

    sent_at_utc = utc_column("sent_at", "Sent at")
    next_attempt_at_utc = utc_column("next_attempt_at", "Next attempt")
    queued_until_utc = utc_column("queued_until", "Queued until")
    lease_expires_at_utc = utc_column("lease_expires_at", "Lease expires")
    created_at_utc = utc_column("created_at", "Created")
    updated_at_utc = utc_column("updated_at", "Updated")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        # View-only: a status changes through services, never through a form.
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        health = path(
            "health/",
            self.admin_site.admin_view(self.health_view),
            name="reminders_reminder_health",
        )
        return [health, *super().get_urls()]

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {})}
        if request.method == "GET":
            extra_context["health"] = scheduler_health()
        return super().changelist_view(request, extra_context)

    def health_view(self, request):
        """Show beat's last publish, the last completed scan, and how many reminders wait or failed."""
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
            "subtitle": None,
            "opts": self.model._meta,
            "health": health,
            "rows": rows,
            "last_scan_ago": (
                timesince(health.last_scan_at, now=health.now) if health.last_scan_at else ""
            ),
            "last_completed_ago": (
                timesince(health.last_completed_at, now=health.now)
                if health.last_completed_at
                else ""
            ),
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

    @admin.action(
        description="Decide reminders of unknown outcome", permissions=["resolve_unknown"]
    )
    def resolve_unknown(self, request, queryset):
        """Ask for a decision and a reason, then mark unknown reminders sent or send them again."""
        confirming = request.POST.get(CONFIRM) == "yes"
        form = ResolveUnknownForm(request.POST if confirming else None)
        if confirming and form.is_valid():
            result = reminder_resolve_unknown(
                reminders=queryset,
                decision=form.cleaned_data["decision"],
                reason=form.cleaned_data["reason"],
                actor=request.user,
            )
            self.message_user(
                request,
                resolve_message(result, not_found=self._missing(request, found=result.selected)),
                messages.SUCCESS if result.changed else messages.WARNING,
            )
            return None
        preview = reminder_resolve_preview(reminders=queryset, send_again=True)
        return self._confirmation(
            request,
            action="resolve_unknown",
            title="Decide reminders of unknown outcome",
            intro="the selected reminders",
            preview=preview,
            missing=self._missing(request, found=preview.selected),
            eligible_label="Of unknown outcome and still before the deadline (can be sent again)",
            submit_label="Record the decision",
            form=form,
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

    @admin.display(description="Deadline (UTC)", ordering="workshop__starts_at")
    def deadline_utc(self, obj: Reminder) -> str:
        return format_utc(obj.deadline_at)

    @admin.display(description="Last provider error")
    def short_error(self, obj: Reminder) -> str:
        """The provider's last error only: a staff note or status reason is not an error."""
        text = obj.last_error
        if not text:
            return "-"
        return text if len(text) <= 80 else text[:77] + "..."


@admin.register(StaffDecision)
class StaffDecisionAdmin(admin.ModelAdmin):
    """Every staff decision, read-only: who, when, why, and links to what it changed."""

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
    )
    readonly_fields = fields
    created_at_utc = utc_column("created_at", "Decided")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

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


def _ids_link(changelist: str, ids: list[int], noun: str) -> str:
    """Link to the changelist filtered to ``ids`` (an ``id__in`` lookup), with the count."""
    if not ids:
        return "-"
    url = f"{reverse(changelist)}?{urlencode({'id__in': ','.join(map(str, ids))})}"
    return format_html('<a href="{}">{}</a>', url, _plural(len(ids), noun))


class WorkshopDecisionForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        max_length=REASON_MAX_LENGTH,
        help_text="Recorded with the decision, with your name and the time.",
    )


admin.site.unregister(Workshop)


@admin.register(Workshop)
class WorkshopAdmin(StaffActionsMixin, BaseWorkshopAdmin):
    """Workshops with their reminders counted by status, and the workshop replay action."""

    list_display = ("title", "start_local", "start_utc", "status", "reminder_counts", "timezone")
    actions = ["cancel_selected", "reinstate_selected", "replay_for_selected"]
    readonly_fields = (*BaseWorkshopAdmin.readonly_fields, "reminder_counts", "text_reach")
    change_form_template = "admin/reminders/workshop/change_form.html"

    # The base's sections, with what an edit of the text reaches under the text
    # and the reminder counts beside the status.
    fieldsets = (
        *BaseWorkshopAdmin.fieldsets[:-2],
        (
            BaseWorkshopAdmin.fieldsets[-2][0],
            {
                **BaseWorkshopAdmin.fieldsets[-2][1],
                "fields": (*BaseWorkshopAdmin.fieldsets[-2][1]["fields"], "text_reach"),
            },
        ),
        (None, {"fields": ("status", "reminder_counts", "created_at_utc", "updated_at_utc")}),
    )

    @admin.display(description="Who gets which text")
    def text_reach(self, obj: Workshop) -> str:
        """Per language of the enrolled attendees, the text they get; and what an edit reaches."""
        if obj.pk is None:
            return "-"
        rows, unclaimed, frozen = workshop_text_reach(obj)
        summary = format_html(
            '<p id="text-reach-summary">Saving a changed text reaches <strong>{}</strong>; {}.</p>',
            _plural(unclaimed, "reminder") + " not yet claimed",
            _kept(frozen),
        )
        if not rows:
            return summary
        table = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (r.language_name, r.attendees, r.unclaimed, r.subject_source, r.intro_source)
                for r in rows
            ),
        )
        return format_html(
            '{}<table id="text-reach"><thead><tr><th>Language</th><th>Attendees</th>'
            "<th>Not yet claimed</th><th>Subject</th><th>Intro</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            summary,
            table,
        )

    def save_model(self, request, obj, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and set(form.changed_data) & TEXT_FIELDS:
            _rows, unclaimed, frozen = workshop_text_reach(obj)
            self.message_user(
                request,
                f"The new text reaches {_plural(unclaimed, 'reminder')} not yet claimed; "
                f"{_kept(frozen)}.",
                messages.INFO,
            )

    def get_urls(self):
        preview = path(
            "<path:object_id>/preview/",
            self.admin_site.admin_view(self.preview_view),
            name="workshops_workshop_preview",
        )
        return [preview, *super().get_urls()]

    def preview_view(self, request, object_id):
        """Show the reminder a chosen enrolled attendee would get: headers, text, HTML and .ics.

        Read only, and with the view permission: nothing is sent, claimed or
        stored. A POST ("Send me a test", permission ``send_test_reminder``)
        queues a test of it to the staff member's own address
        (reminders.testsend) and comes back here.
        """
        workshop = self.get_object(request, object_id)
        if workshop is None:
            raise Http404("No such workshop.")
        if not self.has_view_permission(request, workshop):
            raise PermissionDenied
        if request.method == "POST":
            return self._send_test(request, workshop)
        enrolled = list(
            Attendee.objects.filter(
                enrollments__workshop=workshop, enrollments__status=Enrollment.Status.ACTIVE
            ).order_by("name", "pk")
        )
        chosen = None
        wanted = request.GET.get("attendee", "")
        if wanted.isdigit():
            chosen = next((a for a in enrolled if a.pk == int(wanted)), None)
        error = ""
        if wanted and chosen is None:
            error = NOT_ENROLLED
        chosen = chosen or (enrolled[0] if enrolled else None)
        preview = (
            reminder_preview(workshop=workshop, attendee=chosen, now=default_clock().now())
            if chosen is not None
            else None
        )
        envelope = preview.envelope if preview else None
        context = {
            **self.admin_site.each_context(request),
            "text": preview.text if preview else None,
            "text_language": language_name(preview.text.language) if preview else "",
            "frozen": preview.frozen if preview else False,
            "may_send_test": request.user.has_perm("reminders.send_test_reminder"),
            "title": f"Preview of the reminder for {workshop.title}",
            "subtitle": None,
            "opts": self.model._meta,
            "original": workshop,
            "enrolled": enrolled,
            "chosen": chosen,
            "error": error,
            "envelope": envelope,
            "ics": envelope.attachments[0].content.decode() if envelope else "",
        }
        return TemplateResponse(request, "admin/reminders/workshop/preview.html", context)

    def _send_test(self, request, workshop):
        if not request.user.has_perm("reminders.send_test_reminder"):
            raise PermissionDenied
        wanted = request.POST.get("attendee", "")
        back = reverse("admin:workshops_workshop_preview", args=[workshop.pk])
        attendee = Attendee.objects.filter(pk=int(wanted)).first() if wanted.isdigit() else None
        if attendee is None:
            self.message_user(request, "Choose an attendee to test.", messages.ERROR)
            return HttpResponseRedirect(back)
        back += f"?{urlencode({'attendee': attendee.pk})}"
        try:
            decision = reminder_send_test_request(
                workshop=workshop, attendee=attendee, actor=request.user
            )
        except ValidationError as error:
            self.message_user(request, " ".join(error.messages), messages.ERROR)
            return HttpResponseRedirect(back)
        audit = reverse("admin:reminders_staffdecision_change", args=[decision.pk])
        self.message_user(
            request,
            format_html(
                "A test of {}'s reminder is on its way to {}; its outcome is on "
                '<a href="{}">the staff decision</a>.',
                attendee.name,
                request.user.email,
                audit,
            ),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(back)

    def get_queryset(self, request):
        # One query for the whole page: a filtered COUNT per status.
        return (
            super()
            .get_queryset(request)
            .annotate(
                **{
                    f"reminders_{status}": Count("reminders", filter=Q(reminders__status=status))
                    for status in Status.values
                }
            )
        )

    @admin.display(description="Reminders")
    def reminder_counts(self, obj: Workshop) -> str:
        """Link each non-zero status count to the reminders changelist, filtered."""
        changelist = reverse("admin:reminders_reminder_changelist")
        counts = [(status, getattr(obj, f"reminders_{status}", 0)) for status in Status.values]
        links = [
            (f"{changelist}?{urlencode({'workshop__id__exact': obj.pk, 'status__exact': status})}",
             count, status)
            for status, count in counts
            if count
        ]  # fmt: skip
        return format_html_join(", ", '<a href="{}">{}&nbsp;{}</a>', links) if links else "-"

    @admin.action(description="Replay reminders for selected workshops", permissions=["replay"])
    def replay_for_selected(self, request, queryset):
        """Preview, then replay the replayable reminders of every selected workshop."""
        found = 0 if self._selection_state(request)["select_across"] else queryset.count()
        return self._replay(
            request,
            reminders=Reminder.objects.filter(workshop__in=queryset.order_by().values("pk")),
            action="replay_for_selected",
            title="Replay reminders of the selected workshops",
            intro="the reminders of the selected workshops",
            missing=self._missing(request, found=found, key="workshops_not_found"),
        )

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("workshops.cancel_workshop")

    @admin.action(description="Cancel selected workshops", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        """Preview, ask for a reason, then cancel the selected workshops and their reminders."""
        return self._workshop_decision(
            request,
            queryset,
            action="cancel_selected",
            preview=workshop_cancel_preview,
            run=workshops_cancel,
            title="Cancel the selected workshops",
            eligible_label="Scheduled workshops that will be cancelled",
            verb="cancel",
            explanation="Attendees get no reminder for a cancelled workshop. You can reinstate "
            "it later: its reminders are then planned again, unless the cutoff has passed.",
        )

    @admin.action(description="Reinstate selected workshops", permissions=["cancel"])
    def reinstate_selected(self, request, queryset):
        """Preview, ask for a reason, then reinstate cancelled workshops and re-plan reminders."""
        return self._workshop_decision(
            request,
            queryset,
            action="reinstate_selected",
            preview=workshop_reinstate_preview,
            run=workshops_reinstate,
            title="Reinstate the selected workshops",
            eligible_label="Cancelled workshops that will be scheduled again",
            verb="reinstate",
            explanation="Reinstated workshops are scheduled again; a reminder already sent is "
            "never sent twice.",
        )

    def _workshop_decision(
        self, request, queryset, *, action, preview, run, title, eligible_label, verb, explanation
    ):
        confirming = request.POST.get(CONFIRM) == "yes"
        form = WorkshopDecisionForm(request.POST if confirming else None)
        if confirming and form.is_valid():
            result = run(workshops=queryset, reason=form.cleaned_data["reason"], actor=request.user)
            missing = self._missing(request, found=result.selected, key="workshops_not_found")
            self.message_user(
                request,
                _workshop_message(result, verb=verb, missing=missing),
                messages.SUCCESS if result.changed else messages.WARNING,
            )
            return None
        counted: WorkshopPreview = preview(workshops=queryset)
        missing = self._missing(request, found=counted.selected, key="workshops_not_found")
        skipped = {**counted.skipped, **missing}
        return self._decision_page(
            request,
            title=title,
            action=action,
            noun="workshop",
            explanation=explanation,
            preview=counted,
            eligible_label=eligible_label,
            effect_rows=[
                (label, counted.effects[key])
                for key, label in WORKSHOP_EFFECT_LABELS.items()
                if key in counted.effects
            ],
            skipped_rows=[
                (label, skipped[key])
                for key, label in {**WORKSHOP_SKIP_LABELS, **SKIP_LABELS}.items()
                if skipped.get(key)
            ],
            submit_label=f"Yes, {verb} {_plural(counted.eligible, 'workshop')}",
            form=form,
        )


def _workshop_message(result: WorkshopDecisionResult, *, verb: str, missing: dict) -> str:
    done = {"cancel": "Cancelled", "reinstate": "Reinstated"}[verb]
    what = {"cancel": "cancelled", "reinstate": "planned again or marked missed or unknown"}[verb]
    text = (
        f"{done} {_plural(result.changed, 'workshop')}; "
        f"{_plural(result.reminders, 'reminder')} {what}. The decision is recorded."
    )
    skipped = {**result.skipped, **missing}
    labels = {**WORKSHOP_SKIP_LABELS, **SKIP_LABELS}
    parts = [f"{count} {labels.get(key, key)}" for key, count in skipped.items() if count]
    return text + (f" Skipped: {', '.join(parts)}." if parts else "")


admin.site.unregister(Attendee)


@admin.register(Attendee)
class AttendeeAdmin(StaffActionsMixin, BaseAttendeeAdmin):
    """Attendees, with the audited erasure of their personal data."""

    actions = ["erase_selected"]
    list_display = (*BaseAttendeeAdmin.list_display, "erased_at_utc")
    readonly_fields = ("erased_at_utc",)
    erased_at_utc = utc_column("erased_at", "Erased")

    def has_erase_permission(self, request) -> bool:
        return request.user.has_perm("workshops.erase_attendee")

    @admin.action(description="Erase personal data of selected attendees", permissions=["erase"])
    def erase_selected(self, request, queryset):
        """Preview, ask for a reason, then erase names and emails and cancel enrollments."""
        confirming = request.POST.get(CONFIRM) == "yes"
        form = WorkshopDecisionForm(request.POST if confirming else None)
        if confirming and form.is_valid():
            result = attendees_erase(
                attendees=queryset, reason=form.cleaned_data["reason"], actor=request.user
            )
            self.message_user(
                request,
                f"Erased the personal data of {_plural(result.erased, 'attendee')}; "
                f"{_plural(result.reminders_cancelled, 'reminder')} cancelled. "
                "The decision is recorded.",
                messages.SUCCESS if result.erased else messages.WARNING,
            )
            return None
        counted = attendee_erase_preview(attendees=queryset)
        skipped = counted.selected - counted.eligible
        return self._decision_page(
            request,
            title="Erase personal data of the selected attendees",
            action="erase_selected",
            noun="attendee",
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
            submit_label=f"Yes, erase {_plural(counted.eligible, 'attendee')}",
            form=form,
        )
