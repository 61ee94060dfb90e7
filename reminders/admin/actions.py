"""What staff actions share: the confirmation page, the permission check, the messages."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from reminders.admin.columns import plural
from reminders.admin.decision import DECISION_SKIPS
from reminders.admin.forms import ReasonForm, ReplayForm
from reminders.models import StaffDecision, id_from_text
from reminders.selectors import reminder_replay_preview, reminder_resolve_preview
from reminders.services.replay import StaffActionResult, reminder_replay_selection

CONFIRM = "post"


def confirmed_form(request, form_class):
    """Return the action's form, bound (so possibly valid) only once staff confirmed."""
    return form_class(request.POST if request.POST.get(CONFIRM) == "yes" else None)


def skipped_rows(skipped: dict[str, int]) -> list[tuple[str, int]]:
    """Return (label, count) for each non-zero skip, in the order of DECISION_SKIPS."""
    return [(label, skipped[key]) for key, label in DECISION_SKIPS.items() if skipped.get(key)]


def skipped_text(skipped: dict[str, int]) -> str:
    """Return " Skipped: 2 already sent, 1 past the cutoff." or ""."""
    parts = [f"{count} {label}" for label, count in skipped_rows(skipped)]
    return f" Skipped: {', '.join(parts)}." if parts else ""


def _queued_later(result: StaffActionResult) -> str:
    text = f", {result.later} queued by the next scan" if result.later else ""
    if result.waiting:
        text += f", {result.waiting} waiting for their send window"
    return text


def replay_message(result: StaffActionResult, *, not_found: dict[str, int]) -> str:
    skipped = skipped_text({**result.skipped, **not_found})
    if result.running:
        url = reverse("admin:reminders_staffdecision_change", args=[result.audit_id])
        return format_html(
            "Replaying {} in the background: a worker re-arms and queues them in chunks. "
            'Follow its progress and final counts in <a href="{}">staff decision {}</a>.{}',
            plural(result.selected, "selected reminder"),
            url,
            result.audit_id,
            skipped,
        )
    if not result.changed:
        return "Nothing was replayed." + skipped
    return (
        f"Replayed {plural(result.changed, 'reminder')}: {result.queued} queued for delivery"
        f"{_queued_later(result)}.{skipped}"
    )


def resolve_message(result: StaffActionResult, *, not_found: dict[str, int]) -> str:
    skipped = skipped_text({**result.skipped, **not_found})
    if not result.changed:
        return "No reminder was changed." + skipped
    if result.action == StaffDecision.Action.MARK_SENT:
        return f"Marked {plural(result.changed, 'reminder')} as sent.{skipped}"
    return (
        f"Sending {plural(result.changed, 'reminder')} again: {result.queued} queued"
        f"{_queued_later(result)}.{skipped}"
    )


def resolve_effects(*, reminders) -> list[tuple[str, int]]:
    """Return what "Send again" would do; the page's preview counts "Mark as sent"."""
    again = reminder_resolve_preview(reminders=reminders, send_again=True)
    left = {key: count for key, count in again.skipped.items() if key != "not_unknown"}
    return [
        ("Send again: queued again (still before the deadline)", again.eligible),
        *((f"Send again leaves alone: {label}", count) for label, count in skipped_rows(left)),
    ]


class StaffActionsMixin:
    """Confirmation pages, permission checks and id validation for staff actions on a changelist."""

    def has_replay_permission(self, request) -> bool:
        return request.user.has_perm("reminders.replay_reminder")

    def changelist_view(self, request, extra_context=None):
        # A forged POST naming a forbidden action gets 403, not "No action selected.".
        allowed = self.get_actions(request)
        for name in request.POST.getlist("action"):
            if name in (self.actions or ()) and name not in allowed:
                raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def response_action(self, request, queryset):
        invalid = [
            value
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            if id_from_text(value) is None
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
            # Read as Django's action form reads it (any value but "", "0" or "false" is yes),
            # so the confirmation carries over the selection the action ran on.
            "select_across": forms.BooleanField(required=False).clean(
                request.POST.get("select_across")
            ),
        }

    def _missing(self, request, *, found: int, key: str = "not_found") -> dict[str, int]:
        """Return the ticked ids that matched nothing, as a skip count (none with "select all")."""
        state = self._selection_state(request)
        if state["select_across"]:
            return {}
        missing = len({id_from_text(value) for value in state["selected_ids"]}) - found
        return {key: missing} if missing > 0 else {}

    def _confirmation_page(self, request, template: str, *, form, **context) -> TemplateResponse:
        """Render admin/reminders/``template``; its form posts the selection back, confirmed."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "noun": self.opts.verbose_name,
            "media": self.media + form.media,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "confirm_field": CONFIRM,
            "changelist_url": request.get_full_path(),
            **self._selection_state(request),
            **context,
        }
        return TemplateResponse(request, f"admin/reminders/{template}", context)

    def _reminder_action(
        self, request, form_class, *, reminders, preview, run, message, submit_label,
        missing=None, effects=None, **page,
    ):  # fmt: skip
        """Preview an action on ``reminders``, or run it once confirmed with the form's fields.

        ``effects``, if given, returns more (label, count) rows for the preview.
        """
        form = confirmed_form(request, form_class)
        if not form.is_valid():
            counted = preview(reminders=reminders)
            if missing is None:
                missing = self._missing(request, found=counted.selected)
            return self._confirmation_page(
                request,
                "staff_action_confirmation.html",
                preview=counted,
                effect_rows=effects(reminders=reminders) if effects else [],
                skipped_rows=skipped_rows({**counted.skipped, **missing}),
                submit_label=submit_label.format(plural(counted.eligible, "reminder")),
                form=form,
                **page,
            )
        result = run(reminders=reminders, actor=request.user, **form.cleaned_data)
        if missing is None:
            missing = self._missing(request, found=result.selected)
        self.message_user(
            request,
            message(result, not_found=missing),
            messages.SUCCESS if result.changed or result.running else messages.WARNING,
        )
        return None

    def _replay(self, request, **kwargs):
        """Preview a replay, or run it once confirmed (``kwargs`` as for _reminder_action)."""
        return self._reminder_action(
            request,
            ReplayForm,
            preview=reminder_replay_preview,
            run=reminder_replay_selection,
            message=replay_message,
            eligible_label="Will be queued for delivery again",
            submit_label="Yes, replay {}",
            **kwargs,
        )

    def _decision(
        self, request, *, action, preview, run, effect_labels, title, eligible_label, verb,
        explanation, done,
    ):  # fmt: skip
        """Preview a decision, or run it once confirmed with a reason (``done`` takes its counts)."""
        form = confirmed_form(request, ReasonForm)
        noun = self.opts.verbose_name
        not_found = f"{noun}s_not_found"
        if form.is_valid():
            result = run(reason=form.cleaned_data["reason"], actor=request.user)
            missing = self._missing(request, found=result.selected, key=not_found)
            text = done.format(
                changed=plural(result.changed, noun),
                reminders=plural(result.reminders, "reminder"),
                attendees=plural(result.reminders, "reminded attendee"),
            )
            self.message_user(
                request,
                f"{text} The decision is recorded." + skipped_text({**result.skipped, **missing}),
                messages.SUCCESS if result.changed else messages.WARNING,
            )
            return None
        counted = preview()
        missing = self._missing(request, found=counted.selected, key=not_found)
        return self._confirmation_page(
            request,
            "workshop_decision_confirmation.html",
            title=title,
            action=action,
            explanation=explanation,
            preview=counted,
            eligible_label=eligible_label,
            effect_rows=[
                (label, counted.effects[key])
                for key, label in effect_labels.items()
                if key in counted.effects
            ],
            skipped_rows=skipped_rows({**counted.skipped, **missing}),
            submit_label=f"Yes, {verb} {plural(counted.eligible, noun)}",
            form=form,
        )
