"""Admin forms: workshops in their zone's wall-clock time, enrollments, decision reasons."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from django import forms
from django.contrib.admin.widgets import AdminDateWidget, AdminSplitDateTime
from django.core.exceptions import ValidationError

from clock import default_clock
from delivery.addresses import address_slip, attendee_address_refusal
from reminders.models import StaffDecision, id_from_text
from reminders.services.replay import REASON_MAX_LENGTH
from workshops.models import Attendee, Enrollment, Workshop
from workshops.services import ERASED_NOT_ENROLLED
from workshops.validators import zone_choices

ZONE_ERROR = "%(value)s is not a known time zone; use an IANA name such as Europe/Berlin."


class LocalSplitDateTime(AdminSplitDateTime):
    """The admin's date picker and an HH:MM time, without "Now" (the server's zone, not ours)."""

    class Media:
        # After Django's shortcuts: "Today" in the workshop's zone, no "server time" note.
        js = [
            "admin/js/calendar.js",
            "admin/js/admin/DateTimeShortcuts.js",
            "reminders/workshop_dates.js",
        ]

    def __init__(self, attrs=None) -> None:
        widgets = [AdminDateWidget, forms.TimeInput(attrs={"size": "8"}, format="%H:%M")]
        forms.MultiWidget.__init__(self, widgets, attrs)


def aware_in_zone(local: datetime, zone: ZoneInfo) -> datetime:
    """Return the UTC instant of ``local`` in ``zone``; refuse a time DST skips or repeats."""
    if not 1971 <= local.year <= 9998:
        # Past the calendar's ends a zone's offset overflows (9999-12-31 in Etc/GMT+12).
        raise ValidationError(
            f"{local:%Y-%m-%d} is out of range: enter a date between 1971 and 9998.",
            code="out_of_range",
        )
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

    widget = LocalSplitDateTime

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # The field's label names no one input (a label is for one): each says what it is.
        date, time = self.widget.widgets
        date.attrs["aria-label"] = f"{self.label}: date"
        time.attrs["aria-label"] = f"{self.label}: time"

    def compress(self, data_list):
        # Naive, unlike Django's; required, so MultiValueField refused a missing part already.
        return datetime.combine(*data_list)


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
            "language", "reminder_subject", "reminder_intro", "notice_intro",
        )  # fmt: skip
        widgets = {
            "reminder_intro": forms.Textarea(attrs={"rows": 5, "cols": 80}),
            "notice_intro": forms.Textarea(attrs={"rows": 4, "cols": 80}),
        }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:  # saved by the services: both times and the zone are set
            for name in ("starts_at", "ends_at"):
                local = getattr(self.instance, name).astimezone(self.instance.zone)
                # As the form shows it: to the minute.
                self.initial[name] = local.replace(tzinfo=None, second=0, microsecond=0)

    def clean(self):
        cleaned = super().clean()
        # Only a listed IANA name gets here: ZoneInfo opens each.
        zone = ZoneInfo(cleaned["timezone"]) if cleaned.get("timezone") else None
        for name in ("starts_at", "ends_at"):
            local = cleaned.get(name)
            if local is None:
                continue
            if zone is None:
                # The zone has its own error; stay aware so the model adds no second one.
                cleaned[name] = local.replace(tzinfo=UTC)
                continue
            if self._as_shown(name, local, zone):
                # Kept as stored: the API's seconds, or its time in a daylight-saving overlap,
                # which the form cannot type, do not block or move an edit of anything else.
                cleaned[name] = getattr(self.instance, name)
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

    def _as_shown(self, name: str, local: datetime, zone: ZoneInfo) -> bool:
        """Whether ``local`` is the saved time ``name`` as the form showed it, in the same zone."""
        return (
            self.instance.pk is not None
            and zone.key == self.instance.timezone
            and local == self.initial.get(name)
        )


CANCEL_BY_ACTION = (
    'Cancel enrollments with the action "Cancel selected enrollments" on the enrollment '
    "list: it shows what happens to their reminders, asks for a reason and records the "
    "decision."
)


def _becomes(form: forms.ModelForm, status: str) -> bool:
    """Whether the form would make an enrollment ``status`` (new, or changed to it)."""
    wanted = form.cleaned_data.get("status") == status
    return wanted and (form.instance.pk is None or "status" in form.changed_data)


def _refuse_erased(form: forms.ModelForm) -> None:
    """Refuse to make an erased attendee's enrollment active (the service would refuse it)."""
    attendee = form.cleaned_data.get("attendee") or getattr(form.instance, "attendee", None)
    if attendee is not None and attendee.erased_at and _becomes(form, Enrollment.Status.ACTIVE):
        form.add_error("attendee" if form.instance.pk is None else "status", ERASED_NOT_ENROLLED)


CANCELLED_TWIN = (
    "This attendee's enrollment in this workshop was cancelled: to enrol them again, open "
    "that enrollment and set its status back to active."
)


def _refuse_cancelled_twin(form: forms.ModelForm) -> None:
    """Point a new enrollment whose attendee's one in the workshop was cancelled to that one
    (the unique constraint would say "already enrolled", the opposite)."""
    attendee, workshop = form.cleaned_data.get("attendee"), form.cleaned_data.get("workshop")
    if form.instance.pk is not None or attendee is None or workshop is None or not workshop.pk:
        return
    if form.has_error("attendee"):  # erased: they cannot be enrolled again at all
        return
    cancelled = Enrollment.Status.CANCELLED
    if Enrollment.objects.filter(attendee=attendee, workshop=workshop, status=cancelled).exists():
        form.add_error("attendee", CANCELLED_TWIN)


class ChosenByIdMixin:
    """Autocomplete foreign keys take an id or nothing: the widget's redraw raised on " " or "²"."""

    chosen_by_id: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._not_ids = []
        if not self.is_bound:
            return
        data = self.data.copy()
        for name in self.chosen_by_id:
            raw = data.get(self.add_prefix(name), "")
            if raw and id_from_text(str(raw)) is None:
                data[self.add_prefix(name)] = ""
                self._not_ids.append(name)
        if self._not_ids:
            self.data = data

    def clean(self):
        cleaned = super().clean()
        for name in self._not_ids:
            self._errors.pop(name, None)
            self.add_error(name, f"Choose the {name} from the list; what was sent is no id.")
        return cleaned


class EnrollmentInlineForm(ChosenByIdMixin, forms.ModelForm):
    chosen_by_id = ("attendee",)

    class Meta:
        model = Enrollment
        fields = ("attendee", "status")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            # A row keeps its attendee (clean refuses a move): offered alone, the autocomplete's
            # query per row is not made.
            attendee = self.instance.attendee
            self.fields["attendee"].widget = forms.Select(choices=[(attendee.pk, str(attendee))])
        # A row of the table has its column's header and no label: each input says its name.
        for field in self.fields.values():
            field.widget.attrs["aria-label"] = field.label

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk and "attendee" in self.changed_data:
            self.add_error(
                "attendee",
                "An enrollment cannot move to another attendee: cancel it and enrol the other "
                "attendee in a new row.",
            )
        else:
            _refuse_erased(self)
            _refuse_cancelled_twin(self)
        return cleaned


class EnrollmentInlineFormSet(forms.BaseInlineFormSet):
    def clean(self) -> None:
        super().clean()
        if self.save_as_new:
            return  # a copy carries the active rows over and leaves the cancelled ones
        changed = [form for form in self.forms if form.has_changed()]
        for form in changed:
            if _becomes(form, Enrollment.Status.CANCELLED):
                form.add_error("status", CANCEL_BY_ACTION)
        workshop = self.instance
        if workshop.pk and not workshop.is_scheduled:
            if any(_becomes(form, Enrollment.Status.ACTIVE) for form in changed):
                raise ValidationError(
                    "This workshop is cancelled; enrol attendees in a scheduled workshop.",
                    code="workshop_cancelled",
                )


class EnrollmentForm(ChosenByIdMixin, forms.ModelForm):
    chosen_by_id = ("attendee", "workshop")

    class Meta:
        model = Enrollment
        fields = ("attendee", "workshop", "status")

    def clean(self):
        cleaned = super().clean()
        if _becomes(self, Enrollment.Status.CANCELLED):
            self.add_error("status", CANCEL_BY_ACTION)
        workshop = cleaned.get("workshop") or getattr(self.instance, "workshop", None)
        activates = _becomes(self, Enrollment.Status.ACTIVE)
        if activates and workshop is not None and not workshop.is_scheduled:
            self.add_error(
                "workshop" if self.instance.pk is None else "status",
                "This workshop is cancelled; enrol the attendee in a scheduled workshop.",
            )
        _refuse_erased(self)
        _refuse_cancelled_twin(self)
        return cleaned


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
        max_length=REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded with the decision, e.g. 'provider log shows it was delivered'.",
        error_messages={"required": "Give a reason: it is recorded with the decision."},
    )


class ReasonForm(forms.Form):
    """The required reason of a decision on workshops, enrollments, attendees or suppressions."""

    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        max_length=REASON_MAX_LENGTH,
        help_text="Recorded with the decision, with your name and the time.",
    )


class AttendeeEmailField(forms.EmailField):
    def validate(self, value) -> None:
        """A usual slip (a dot at the end, a space, a second @) is refused saying what to
        correct, before the validators' 'Enter a valid email address.'"""
        super().validate(value)
        if value and (slip := address_slip(value)) is not None:
            raise ValidationError(slip, code="invalid")


class AttendeeForm(forms.ModelForm):
    class Meta:
        model = Attendee
        fields = ("name", "email", "timezone", "language")
        field_classes = {"email": AttendeeEmailField}

    def clean_email(self) -> str:
        """Refuse an address the delivery engine would refuse at send time, with its reason."""
        email = self.cleaned_data["email"]
        if (refusal := attendee_address_refusal(email)) is not None:
            raise ValidationError(refusal[0], code=refusal[1])
        return email
