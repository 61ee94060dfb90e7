"""Workshops: times in their own zone, reminder counts, the preview and staff decisions."""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from functools import partial

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.db.models import Count, Q
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from clock import default_clock
from reminders.admin.actions import StaffActionsMixin
from reminders.admin.columns import (
    KeepEnrolledMixin,
    NulFreeListMixin,
    copy_saved,
    format_local,
    kept_text,
    plural,
    utc_column,
)
from reminders.admin.decision import DecisionFilter
from reminders.admin.enrollment import say_what_follows
from reminders.admin.forms import EnrollmentInlineForm, EnrollmentInlineFormSet, WorkshopForm
from reminders.content import language_name, notice_preview, reminder_preview
from reminders.models import Reminder, id_from_text
from reminders.selectors import workshop_notice_revisions, workshop_text_reach
from reminders.services.notices import FACT_FIELDS, notices_reach, settle_delay
from reminders.services.testsend import NOT_ENROLLED, reminder_send_test_request
from reminders.services.workshop_decisions import (
    EFFECT_LABELS,
    workshop_cancel_preview,
    workshop_reinstate_preview,
    workshop_silence_preview,
    workshops_cancel,
    workshops_reinstate,
    workshops_silence,
)
from workshops.models import Attendee, Enrollment, Workshop, WorkshopText
from workshops.placeholders import NOTICE_PLACEHOLDERS, PLACEHOLDERS
from workshops.services import (
    TEXT_FIELDS,
    enrollment_create,
    workshop_create,
    workshop_update,
)

Status = Reminder.Status
NOTICE_ONLY_PLACEHOLDERS = {
    name: what for name, what in NOTICE_PLACEHOLDERS.items() if name not in PLACEHOLDERS
}


# A page listing more would post more fields than Django takes (DATA_UPLOAD_MAX_NUMBER_FIELDS):
# past it, a workshop's enrollments are listed and added on their own page.
INLINE_ENROLLMENTS_MAX = 200


class EnrollmentInline(admin.TabularInline):
    model = Enrollment
    form = EnrollmentInlineForm
    formset = EnrollmentInlineFormSet
    extra = 0
    can_delete = False
    fields = ("attendee", "status", "created_at_utc")
    readonly_fields = ("created_at_utc",)
    autocomplete_fields = ("attendee",)
    show_change_link = True
    created_at_utc = utc_column("created_at", "Enrolled")

    def get_queryset(self, request):
        # Each row's name shows its attendee and workshop.
        return super().get_queryset(request).select_related("attendee", "workshop")


class WorkshopTextInline(admin.StackedInline):
    """The workshop's reminder text in other languages."""

    model = WorkshopText
    extra = 0
    fields = ("language", "reminder_subject", "reminder_intro")
    formfield_overrides = {
        models.TextField: {"widget": forms.Textarea(attrs={"rows": 4, "cols": 80})}
    }


def placeholder_help(placeholders: dict[str, str]) -> str:
    """Return the placeholders staff may use, as HTML."""
    return format_html_join(", ", "<code>{{{}}}</code> ({})", placeholders.items())


def html_table(table_id: str, headers: tuple[str, ...], rows) -> str:
    """Return an HTML table of ``rows`` (tuples of cells) under ``headers``, escaped."""
    return format_html(
        '<table id="{}"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>',
        table_id,
        format_html_join("", "<th>{}</th>", ((header,) for header in headers)),
        format_html_join(
            "",
            "<tr>{}</tr>",
            ((format_html_join("", "<td>{}</td>", ((cell,) for cell in row)),) for row in rows),
        ),
    )


def _count_reminders(workshops) -> None:
    """Set each workshop's ``reminders_by_status`` (status: count), in one query."""
    counts = defaultdict(dict)
    rows = (
        Reminder.objects.filter(workshop__in=[workshop.pk for workshop in workshops])
        .order_by()
        .values_list("workshop", "status")
        .annotate(Count("pk"))
    )
    for workshop_id, status, count in rows:
        counts[workshop_id][status] = count
    for workshop in workshops:
        workshop.reminders_by_status = counts[workshop.pk]


def _enrollment_total(workshop: Workshop) -> int:
    """Count the workshop's enrollments once per page (its inlines and its field read it)."""
    if not hasattr(workshop, "enrollment_total"):
        workshop.enrollment_total = workshop.enrollments.count()
    return workshop.enrollment_total


@admin.register(Workshop)
class WorkshopAdmin(NulFreeListMixin, KeepEnrolledMixin, StaffActionsMixin, admin.ModelAdmin):
    form = WorkshopForm
    list_display = ("title", "start_local", "start_utc", "status", "reminder_counts", "timezone")
    actions = ["cancel_selected", "reinstate_selected", "silence_selected", "replay_for_selected"]
    change_form_template = "admin/reminders/workshop/change_form.html"
    list_filter = (
        "status",
        ("starts_at", admin.DateFieldListFilter),
        "timezone",
        DecisionFilter,
    )
    search_fields = ("title",)
    date_hierarchy = "starts_at"
    inlines = [WorkshopTextInline, EnrollmentInline]
    save_as = True
    fieldsets = (
        (
            None,
            {"fields": ("title", "timezone", "starts_at", "ends_at", "start_local", "start_utc")},
        ),
        (
            "What reminders show",
            {
                "fields": ("location", "join_url", "contact_name", "contact_email"),
                "description": "Shown in every reminder not yet sent, and in its calendar file. "
                "Replies to a reminder go to the organiser's email.",
            },
        ),
        (
            "Reminder text",
            {
                "fields": ("language", "reminder_subject", "reminder_intro", "text_reach"),
                "description": format_html(
                    "Written in the workshop's language; texts in other languages go below. "
                    "A change reaches only reminders not yet claimed: each reminder keeps the "
                    "text it had when a worker first took it. Placeholders: {}.",
                    placeholder_help(PLACEHOLDERS),
                ),
            },
        ),
        (
            "Change notices",
            {
                "fields": ("notice_intro", "notice_revisions"),
                "description": format_html(
                    "An attendee already reminded gets one notice when the start, end, place or "
                    "join link changes, or the workshop is cancelled or back on: edits within "
                    "{} seconds make one notice, never later than the start. The intro is "
                    "for attendees reading the workshop's language (blank: the built-in one). "
                    "Placeholders: {}, and {}.",
                    settings.REMINDERS_NOTICE_SETTLE,
                    placeholder_help(PLACEHOLDERS),
                    placeholder_help(NOTICE_ONLY_PLACEHOLDERS),
                ),
            },
        ),
        (
            None,
            {
                "fields": (
                    "status",
                    "enrollment_count",
                    "reminder_counts",
                    "created_at_utc",
                    "updated_at_utc",
                )
            },
        ),
    )
    # What the form does not edit is shown read-only.
    readonly_fields = tuple(
        name
        for _, options in fieldsets
        for name in options["fields"]
        if name not in WorkshopForm.Meta.fields
    )
    start_utc = utc_column("starts_at", "Start")
    created_at_utc = utc_column("created_at", "Created")
    updated_at_utc = utc_column("updated_at", "Updated")

    def get_inlines(self, request, obj):
        if request.method == "POST" and "_saveasnew" in request.POST:
            # A copy posts the inlines its original's page showed: none past the limit.
            original = request.resolver_match.kwargs.get("object_id")
            obj = self.get_object(request, unquote(original)) if original else obj
        if obj is not None and obj.pk and _enrollment_total(obj) > INLINE_ENROLLMENTS_MAX:
            return [WorkshopTextInline]
        return self.inlines

    @admin.display(description="Enrollments")
    def enrollment_count(self, obj: Workshop) -> str:
        count = _enrollment_total(obj) if obj.pk else 0
        listed = reverse("admin:workshops_enrollment_changelist") + f"?workshop__id__exact={obj.pk}"
        if count <= INLINE_ENROLLMENTS_MAX:
            return format_html('<a href="{}">{}</a>', listed, count)
        return format_html(
            '{}: more than {} are not listed here; <a href="{}">see and add them on the '
            "enrollments page</a>, or import a CSV file.",
            count,
            INLINE_ENROLLMENTS_MAX,
            listed,
        )

    @admin.display(description="Start (workshop's zone)", ordering="starts_at")
    def start_local(self, obj: Workshop) -> str:
        return format_local(obj.starts_at, obj.zone) if obj.starts_at else "-"

    def save_model(self, request, obj: Workshop, form, change: bool) -> None:
        """Save through workshop_create / workshop_update, never ``obj.save()``."""
        values = {name: form.cleaned_data[name] for name in WorkshopForm.Meta.fields}
        changed = set(form.changed_data)
        # The times are typed in the zone: a new zone under the same typed times moves them.
        moved = change and not changed.isdisjoint({*FACT_FIELDS, "timezone"})
        unsent = (
            list(
                Reminder.objects.filter(
                    workshop=obj.pk, status__in=Reminder.OPEN_STATUSES
                ).values_list("pk", flat=True)
            )
            if moved
            else []
        )
        if change:
            saved = workshop_update(workshop=obj, **values)
        else:
            # Also "Save as new": a fresh workshop from the form's fields alone.
            saved = workshop_create(**values)
        copy_saved(obj, saved)
        if moved:
            self._missed_message(request, unsent)
            self._notice_message(request, obj)
        if change and changed & (TEXT_FIELDS - {"notice_intro"}):
            _rows, unclaimed, frozen = workshop_text_reach(obj)
            self.message_user(
                request,
                f"The new text reaches {plural(unclaimed, 'reminder')} not yet claimed; "
                f"{kept_text(frozen)}.",
                messages.INFO,
            )

    def _missed_message(self, request, unsent: list[int]) -> None:
        """Say how many reminders not yet sent the change made missed (a start inside the cutoff)."""
        late = Reminder.objects.filter(pk__in=unsent, status__in=(Status.MISSED, Status.UNKNOWN))
        missed = late.count()
        if missed:
            self.message_user(
                request,
                f"{plural(missed, 'reminder')} not yet sent will not be sent: the new start is "
                f"less than the cutoff ({plural(settings.REMINDERS_CUTOFF_MINUTES, 'minute')}) "
                "away, so they are missed (unknown, if an earlier call may have reached the "
                "provider). Tell those attendees another way.",
                messages.WARNING,
            )

    def _notice_message(self, request, workshop: Workshop) -> None:
        """Say who will hear of a change to what the reminders told, and when."""
        told = notices_reach(workshops=[workshop.pk]).get(workshop.pk, 0)
        if not told:
            return
        wait = settle_delay(now=default_clock().now(), starts_at=workshop.starts_at)
        self.message_user(
            request,
            f"{plural(told, 'reminded attendee')} will get a change notice with the new details "
            f"in about {_minutes(wait)} (further edits until then make one notice). To tell "
            'them nothing, choose the action "Don\'t notify attendees of the latest change" '
            "with a reason.",
            messages.INFO,
        )

    def save_formset(self, request, form, formset, change: bool) -> None:
        if formset.model is not Enrollment:
            return super().save_formset(request, form, formset, change)
        workshop = form.instance
        formset.save(commit=False)
        made = []
        for enrollment in formset.new_objects:
            # A cancelled row in a copy ("Save as new") is not carried over.
            if enrollment.status == Enrollment.Status.ACTIVE:
                made.append(enrollment_create(attendee=enrollment.attendee, workshop=workshop).pk)
        for enrollment, changed in formset.changed_objects:
            # Only back to active: the formset refuses a cancel (the audited action's).
            if "status" in changed:
                made.append(enrollment_create(attendee=enrollment.attendee, workshop=workshop).pk)
        if made:
            say_what_follows(self, request, made)
        return None

    @admin.display(description="Who gets which text")
    def text_reach(self, obj: Workshop) -> str:
        """Per language of the enrolled attendees, the text they get; and what an edit reaches."""
        if obj.pk is None:
            return "-"
        rows, unclaimed, frozen = workshop_text_reach(obj)
        summary = format_html(
            '<p id="text-reach-summary">Saving a changed text reaches <strong>{}</strong>; {}.</p>',
            plural(unclaimed, "reminder") + " not yet claimed",
            kept_text(frozen),
        )
        if not rows:
            return summary
        return summary + html_table(
            "text-reach",
            ("Language", "Attendees", "Not yet claimed", "Subject", "Intro"),
            (
                (r.language_name, r.attendees, r.unclaimed, r.subject_source, r.intro_source)
                for r in rows
            ),
        )

    @admin.display(description="Revisions and their notices")
    def notice_revisions(self, obj: Workshop) -> str:
        """Each revision the notice scan numbered, newest first, with its notices by status."""
        if obj.pk is None:
            return "-"
        rows = workshop_notice_revisions(obj)
        if not rows:
            return "No change since the reminders went out."
        return html_table(
            "notice-revisions",
            ("Revision", "Says", "Numbered", "State", "Notices"),
            (
                (
                    row.revision.number,
                    _revision_says(row.revision, obj.zone),
                    row.revision.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
                    row.state,
                    ", ".join(f"{n} {status}" for status, n in sorted(row.counts.items())) or "-",
                )
                for row in rows
            ),
        )

    def get_urls(self):
        preview = path(
            "<path:object_id>/preview/",
            self.admin_site.admin_view(self.preview_view),
            name="workshops_workshop_preview",
        )
        return [preview, *super().get_urls()]

    def preview_view(self, request, object_id):
        """Show an enrolled attendee's message; a POST sends a test to the staff member."""
        workshop = self.get_object(request, object_id)
        if workshop is None:
            raise Http404("No such workshop.")
        if not self.has_view_permission(request, workshop):
            raise PermissionDenied
        if request.method == "POST":
            return self._send_test(request, workshop)
        notice = request.GET.get("message") == "notice"
        enrollments = Q(enrollments__workshop=workshop)
        if not notice:  # a change notice also goes to one whose enrollment was cancelled
            enrollments &= Q(enrollments__status=Enrollment.Status.ACTIVE)
        # An erased attendee is told nothing more: no message of theirs to preview.
        enrolled = list(
            Attendee.objects.filter(enrollments, erased_at__isnull=True).order_by("name", "pk")
        )
        wanted = request.GET.get("attendee", "")
        pk = id_from_text(wanted)
        chosen = next((a for a in enrolled if a.pk == pk), None)
        error = NOT_ENROLLED if wanted and chosen is None else ""
        chosen = chosen or next(iter(enrolled), None)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Preview of the {'change notice' if notice else 'reminder'} for "
            f"{workshop.title}",
            "opts": self.opts,
            "original": workshop,
            "notice": notice,
            "enrolled": enrolled,
            "chosen": chosen,
            "error": error,
            "request_token": uuid.uuid4().hex,
        }
        if chosen is not None:
            render = notice_preview if notice else reminder_preview
            preview = render(workshop=workshop, attendee=chosen, now=default_clock().now())
            context |= {
                # One-click unsubscribe stopped the workshop's notices to them.
                "unsubscribed": notice
                and Reminder.objects.filter(
                    workshop=workshop, attendee=chosen, unsubscribed_at__isnull=False
                ).exists(),
                "text": preview.text,
                "text_language": language_name(preview.text.language),
                "frozen": preview.frozen,
                "envelope": preview.envelope,
                "ics": preview.envelope.attachments[0].content.decode(),
            }
        return TemplateResponse(request, "admin/reminders/workshop/preview.html", context)

    def _send_test(self, request, workshop):
        if not request.user.has_perm("reminders.send_test_reminder"):
            raise PermissionDenied
        wanted = request.POST.get("attendee", "")
        token = request.POST.get("request_token", "")
        back = reverse("admin:workshops_workshop_preview", args=[workshop.pk])
        notice = request.POST.get("message") == "notice"
        pk = id_from_text(wanted)
        attendee = Attendee.objects.filter(pk=pk).first() if pk is not None else None
        if attendee is None:
            self.message_user(request, "Choose an attendee to test.", messages.ERROR)
            return HttpResponseRedirect(back)
        query = {"attendee": attendee.pk, **({"message": "notice"} if notice else {})}
        back += f"?{urlencode(query)}"
        try:
            decision = reminder_send_test_request(
                workshop=workshop,
                attendee=attendee,
                actor=request.user,
                # The preview form's one-time token; a malformed one counts as none.
                request_token=token if re.fullmatch("[0-9a-f]{32}", token) else None,
                notice=notice,
            )
        except ValidationError as error:
            self.message_user(request, " ".join(error.messages), messages.ERROR)
            return HttpResponseRedirect(back)
        audit = reverse("admin:reminders_staffdecision_change", args=[decision.pk])
        self.message_user(
            request,
            format_html(
                "A test of {}'s {} is on its way to {}; its outcome is on "
                '<a href="{}">the staff decision</a>.',
                attendee.name,
                "change notice" if notice else "reminder",
                request.user.email,
                audit,
            ),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(back)

    def changelist_view(self, request, extra_context=None):
        year = request.GET.get("starts_at__year", "")
        # The date hierarchy computes the year after: 9999 overflows into a 500. A month or
        # day past what datetime takes is an OverflowError, which Django does not catch.
        month_day = (request.GET.get(f"starts_at__{part}", "") for part in ("month", "day"))
        if (
            year and not (year.isascii() and year.isdigit() and 1971 <= int(year[:6]) <= 9998)
        ) or any(len(value) > 2 for value in month_day):
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        response = super().changelist_view(request, extra_context)
        if cl := getattr(response, "context_data", {}).get("cl"):
            _count_reminders(cl.result_list)  # the page's rows, not every workshop's
        return response

    @admin.display(description="Reminders")
    def reminder_counts(self, obj: Workshop) -> str:
        """Link each non-zero status count to the reminders changelist, filtered."""
        changelist = reverse("admin:reminders_reminder_changelist")
        if not hasattr(obj, "reminders_by_status"):
            _count_reminders([obj])
        counts = [(status, obj.reminders_by_status.get(status, 0)) for status in Status.values]
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
        return self._decision(
            request,
            action="cancel_selected",
            preview=partial(workshop_cancel_preview, workshops=queryset),
            run=partial(workshops_cancel, workshops=queryset),
            effect_labels=EFFECT_LABELS,
            title="Cancel the selected workshops",
            eligible_label="Scheduled workshops that will be cancelled",
            verb="cancel",
            explanation="Attendees get no reminder for a cancelled workshop. You can reinstate "
            "it later: its reminders are then planned again, unless the cutoff has passed.",
            done="Cancelled {changed}; {reminders} cancelled.",
        )

    @admin.action(description="Reinstate selected workshops", permissions=["cancel"])
    def reinstate_selected(self, request, queryset):
        """Preview, ask for a reason, then reinstate cancelled workshops and re-plan reminders."""
        return self._decision(
            request,
            action="reinstate_selected",
            preview=partial(workshop_reinstate_preview, workshops=queryset),
            run=partial(workshops_reinstate, workshops=queryset),
            effect_labels=EFFECT_LABELS,
            title="Reinstate the selected workshops",
            eligible_label="Cancelled workshops that will be scheduled again",
            verb="reinstate",
            explanation="Reinstated workshops are scheduled again; a reminder already sent is "
            "never sent twice.",
            done="Reinstated {changed}; {reminders} planned again or marked missed or unknown.",
        )

    @admin.action(description="Don't notify attendees of the latest change", permissions=["cancel"])
    def silence_selected(self, request, queryset):
        """Preview, ask for a reason, then let the reminded attendees not hear of the change."""
        return self._decision(
            request,
            action="silence_selected",
            preview=partial(workshop_silence_preview, workshops=queryset),
            run=partial(workshops_silence, workshops=queryset),
            effect_labels=EFFECT_LABELS,
            title="Don't notify attendees of the latest change",
            eligible_label="Workshops with reminded attendees not yet told of a change",
            verb="silence",
            explanation="Attendees already reminded get no change notice for the workshop as it "
            "is now (notices not yet sent are marked silenced). A later change is news again.",
            done="{attendees} of {changed} will not be told of the latest change.",
        )


def _revision_says(revision, zone) -> str:
    if revision.cancelled:
        reason = revision.cancellation_reason
        return f"cancelled ({reason})" if reason else "cancelled"
    where = revision.location or revision.join_url or "no place given"
    return f"{format_local(revision.starts_at, zone)}, {where}"


def _minutes(wait) -> str:
    minutes = round(wait.total_seconds() / 60)
    return plural(minutes, "minute") if minutes else "a few seconds"
