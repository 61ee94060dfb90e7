"""Admin for workshops, attendees and enrollments.

Times are shown twice: in the workshop's own zone (what attendees see) and in
UTC (what the scheduler uses), so staff can check the deadline arithmetic.
The workshop form takes the start and end as wall-clock times in the
workshop's zone, and refuses a time that does not exist or happens twice
there (daylight-saving changes).

Every write goes through workshops.services, so reminders follow every change
(the services announce it through workshops.signals): a workshop is created
with workshop_create (also when "Save as new" copies one: the copy starts
with no reminders, and its reminders are planned fresh, FAULTS S4), changed
with workshop_update; enrollments are created and cancelled with
enrollment_create and enrollment_cancel. Status is never edited by hand.
Nothing with enrollments is deleted (no workshop, attendee or enrollment
that has them, and no bulk delete at all): staff cancel instead.

This app never imports reminders: reminders/admin.py extends WorkshopAdmin
with reminder counts and the confirmed, audited staff actions (cancel,
reinstate, replay).
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import AdminDateWidget, AdminSplitDateTime
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Count, Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from clock import default_clock
from workshops.models import Attendee, Enrollment, Workshop, WorkshopText
from workshops.placeholders import PLACEHOLDERS
from workshops.services import (
    enrollment_cancel,
    enrollment_create,
    workshop_create,
    workshop_update,
)
from workshops.validators import zone_choices

ZONE_ERROR = "%(value)s is not a known time zone; use an IANA name such as Europe/Berlin."


def _has_enrollments(obj) -> bool:
    if obj is None:
        return False
    if isinstance(obj, Enrollment):
        return True
    return obj.enrollments.exists()


def _without_bulk_delete(actions: dict) -> dict:
    actions.pop("delete_selected", None)
    return actions


def format_local(moment, zone) -> str:
    """Render an aware datetime in ``zone`` with its abbreviation."""
    if moment is None:
        return "-"
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def format_utc(moment) -> str:
    """Render an aware datetime in UTC."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def utc_column(field: str, label: str):
    """Return an admin display method showing ``field`` in UTC with its zone, never bare.

    Django renders a datetime in TIME_ZONE without saying which; staff compare
    these times with workshops held in many zones.
    """

    @admin.display(description=f"{label} (UTC)", ordering=field)
    def show(self, obj) -> str:
        return format_utc(getattr(obj, field))

    show.__name__ = f"{field}_utc"
    return show


class LocalSplitDateTime(AdminSplitDateTime):
    """The admin's date picker, and the time typed as HH:MM with no "Now" shortcut.

    "Now" fills in the server's clock, while the field is read as wall-clock
    time in the workshop's zone: a start far from where it was meant.
    """

    template_name = "admin/widgets/split_datetime.html"

    def __init__(self, attrs=None) -> None:
        widgets = [AdminDateWidget, forms.TimeInput(attrs={"size": "8"}, format="%H:%M")]
        forms.MultiWidget.__init__(self, widgets, attrs)


def aware_in_zone(local: datetime, zone: ZoneInfo) -> datetime:
    """Return the UTC instant of the wall-clock time ``local`` in ``zone``.

    Raise ValidationError when that wall time does not exist in the zone (the
    clocks jump over it) or happens twice (the clocks go back over it): the
    start of a workshop must be one unambiguous instant.
    """
    first, second = local.replace(tzinfo=zone, fold=0), local.replace(tzinfo=zone, fold=1)
    if first.utcoffset() != second.utcoffset():
        shown = local.strftime("%Y-%m-%d %H:%M")
        if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != local:
            raise ValidationError(
                f"{shown} does not exist in {zone.key}: the clocks jump forward over it. "
                "Choose a time outside the daylight-saving gap.",
                code="nonexistent_time",
            )
        raise ValidationError(
            f"{shown} happens twice in {zone.key}: the clocks go back over it. "
            "Choose a time outside the daylight-saving overlap.",
            code="ambiguous_time",
        )
    return first.astimezone(UTC)


class LocalDateTimeField(forms.SplitDateTimeField):
    """A date and a time typed as wall-clock time; the form attaches the workshop's zone."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("widget", LocalSplitDateTime)
        super().__init__(**kwargs)

    def compress(self, data_list):
        if not data_list:
            return None
        day, time = data_list
        if day in self.empty_values:
            raise ValidationError(self.error_messages["invalid_date"], code="invalid_date")
        if time in self.empty_values:
            raise ValidationError(self.error_messages["invalid_time"], code="invalid_time")
        return datetime.combine(day, time)


class WorkshopForm(forms.ModelForm):
    """Validate everything workshop_create / workshop_update would refuse, as field errors."""

    timezone = forms.ChoiceField(
        choices=zone_choices,
        error_messages={"invalid_choice": ZONE_ERROR},
        help_text="IANA zone the workshop is held in; the times below are in it.",
    )
    starts_at = LocalDateTimeField(
        label="Start (in the workshop's zone)",
        help_text="Wall-clock time where the workshop is held.",
    )
    ends_at = LocalDateTimeField(label="End (in the workshop's zone)")
    join_url = forms.URLField(
        label="Join link",
        required=False,
        max_length=500,
        assume_scheme="https",
        help_text="The link attendees open to join (https), if it is held online.",
    )

    class Meta:
        model = Workshop
        fields = (
            "title", "timezone", "starts_at", "ends_at",
            "location", "join_url", "contact_name", "contact_email",
            "language", "reminder_subject", "reminder_intro",
        )  # fmt: skip
        widgets = {"reminder_intro": forms.Textarea(attrs={"rows": 5, "cols": 80})}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        instance = self.instance
        if instance.pk and instance.timezone:
            zone = instance.zone
            for name in ("starts_at", "ends_at"):
                value = getattr(instance, name)
                if value is not None:
                    self.initial[name] = value.astimezone(zone).replace(tzinfo=None)

    def clean(self):
        cleaned = super().clean()
        try:
            zone = ZoneInfo(cleaned["timezone"]) if cleaned.get("timezone") else None
        except (ZoneInfoNotFoundError, ValueError):
            zone = None
        for name in ("starts_at", "ends_at"):
            local = cleaned.get(name)
            if local is None:
                continue
            if zone is None:
                # The zone has its own error; keep the times aware so the model
                # does not add a second, misleading one.
                cleaned[name] = local.replace(tzinfo=UTC)
                continue
            try:
                cleaned[name] = aware_in_zone(local, zone)
            except ValidationError as error:
                self.add_error(name, error)
        starts_at = cleaned.get("starts_at")
        if (
            self.instance.pk is None
            and zone is not None
            and starts_at is not None
            and starts_at <= default_clock().now()
        ):
            self.add_error(
                "starts_at",
                ValidationError(
                    "The start is in the past; give a future start time.", code="past_start"
                ),
            )
        return cleaned


class EnrollmentInlineForm(forms.ModelForm):
    class Meta:
        model = Enrollment
        fields = ("attendee", "status")

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk and "attendee" in self.changed_data:
            self.add_error(
                "attendee",
                "An enrollment cannot move to another attendee: cancel it and enrol the other "
                "attendee in a new row.",
            )
        return cleaned


class EnrollmentInlineFormSet(forms.BaseInlineFormSet):
    def clean(self) -> None:
        super().clean()
        workshop = self.instance
        if workshop.pk is None or self.save_as_new or workshop.is_scheduled:
            return
        for form in self.forms:
            adds = form.instance.pk is None and form.has_changed()
            revives = form.instance.pk and "status" in form.changed_data
            if (adds or revives) and form.cleaned_data.get("status") == Enrollment.Status.ACTIVE:
                raise ValidationError(
                    "This workshop is cancelled; enrol attendees in a scheduled workshop.",
                    code="workshop_cancelled",
                )


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


class WorkshopTextInline(admin.StackedInline):
    """The workshop's reminder text in other languages (saved as they are: nothing follows)."""

    model = WorkshopText
    extra = 0
    fields = ("language", "reminder_subject", "reminder_intro")
    formfield_overrides = {
        models.TextField: {"widget": forms.Textarea(attrs={"rows": 4, "cols": 80})}
    }


def placeholder_help() -> str:
    """The placeholders staff may use, as the admin lists them next to the text fields."""
    return format_html_join(
        ", ", "<code>{{{}}}</code> ({})", ((name, what) for name, what in PLACEHOLDERS.items())
    )


@admin.register(Workshop)
class WorkshopAdmin(admin.ModelAdmin):
    form = WorkshopForm
    list_display = ("title", "start_local", "start_utc", "timezone", "status")
    list_filter = ("status", ("starts_at", admin.DateFieldListFilter), "timezone")
    search_fields = ("title",)
    date_hierarchy = "starts_at"
    inlines = [WorkshopTextInline, EnrollmentInline]
    save_as = True
    readonly_fields = ("status", "start_local", "start_utc", "created_at_utc", "updated_at_utc")
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
                "fields": ("language", "reminder_subject", "reminder_intro"),
                "description": format_html(
                    "Written in the workshop's language; texts in other languages go below. "
                    "A change reaches only reminders not yet claimed: each reminder keeps the "
                    "text it had when a worker first took it. Placeholders: {}.",
                    placeholder_help(),
                ),
            },
        ),
        (None, {"fields": ("status", "created_at_utc", "updated_at_utc")}),
    )
    created_at_utc = utc_column("created_at", "Created")
    updated_at_utc = utc_column("updated_at", "Updated")

    @admin.display(description="Start (workshop's zone)", ordering="starts_at")
    def start_local(self, obj: Workshop) -> str:
        return format_local(obj.starts_at, obj.zone) if obj.starts_at else "-"

    @admin.display(description="Start (UTC)", ordering="starts_at")
    def start_utc(self, obj: Workshop) -> str:
        return format_utc(obj.starts_at)

    def save_model(self, request, obj: Workshop, form, change: bool) -> None:
        """Save through workshop_create / workshop_update, never ``obj.save()``."""
        values = {name: form.cleaned_data[name] for name in WorkshopForm.Meta.fields}
        if change:
            saved = workshop_update(workshop=obj, **values)
        else:
            # Also "Save as new": the copy is a new workshop with nothing of the
            # original but the form's fields; its reminders are planned fresh.
            saved = workshop_create(**values)
        # The admin carries on with ``obj`` (inlines, change log, redirect).
        for model_field in Workshop._meta.concrete_fields:
            setattr(obj, model_field.attname, getattr(saved, model_field.attname))
        obj._state.adding = False
        obj._state.db = saved._state.db

    def save_formset(self, request, form, formset, change: bool) -> None:
        if formset.model is not Enrollment:
            return super().save_formset(request, form, formset, change)
        workshop = form.instance
        formset.save(commit=False)
        for enrollment in formset.new_objects:
            # A cancelled row in a copy ("Save as new") is not carried over.
            if enrollment.status == Enrollment.Status.ACTIVE:
                enrollment_create(attendee=enrollment.attendee, workshop=workshop)
        for enrollment, changed in formset.changed_objects:
            if "status" not in changed:
                continue
            if enrollment.status == Enrollment.Status.CANCELLED:
                enrollment_cancel(enrollment=enrollment)
            else:
                enrollment_create(attendee=enrollment.attendee, workshop=workshop)
        return None

    def has_delete_permission(self, request, obj=None) -> bool:
        # Staff cancel a workshop instead; one with enrollments (and so reminders and
        # their history) is never deleted.
        return super().has_delete_permission(request, obj) and not _has_enrollments(obj)

    def get_actions(self, request):
        return _without_bulk_delete(super().get_actions(request))


@admin.register(Attendee)
class AttendeeAdmin(admin.ModelAdmin):
    list_display = ("name", "email", "timezone", "enrollment_count")
    search_fields = ("name", "email")
    list_filter = ("timezone",)

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                active_enrollments=Count(
                    "enrollments", filter=Q(enrollments__status=Enrollment.Status.ACTIVE)
                )
            )
        )

    @admin.display(description="Active enrollments", ordering="active_enrollments")
    def enrollment_count(self, obj: Attendee) -> int:
        return obj.active_enrollments

    def has_delete_permission(self, request, obj=None) -> bool:
        return super().has_delete_permission(request, obj) and not _has_enrollments(obj)

    def get_actions(self, request):
        return _without_bulk_delete(super().get_actions(request))


class EnrollmentForm(forms.ModelForm):
    class Meta:
        model = Enrollment
        fields = ("attendee", "workshop", "status")

    def clean(self):
        cleaned = super().clean()
        workshop = cleaned.get("workshop") or getattr(self.instance, "workshop", None)
        activates = cleaned.get("status") == Enrollment.Status.ACTIVE and (
            self.instance.pk is None or "status" in self.changed_data
        )
        if activates and workshop is not None and not workshop.is_scheduled:
            self.add_error(
                "workshop" if self.instance.pk is None else "status",
                "This workshop is cancelled; enrol the attendee in a scheduled workshop.",
            )
        return cleaned


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
        return False  # an enrollment is cancelled, never deleted

    def get_readonly_fields(self, request, obj=None):
        # An enrollment is a fact about one attendee and one workshop: to move
        # someone, cancel this one and enrol them elsewhere.
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
