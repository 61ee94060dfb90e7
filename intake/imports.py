"""The admin's CSV import (upload, preview each row, confirm) and export of a workshop's attendees.

The import writes through intake.services.enrolments_upsert, the API's bulk
path: the same validation, the same ids per integration, all rows or none. Its
preview is that same write, rolled back. A row whose enrolment_status says
cancelled (an exported file's) is not passed to it, whichever workshop the file
is imported into: the file says that person is not coming. The import is
staff's (``by_staff``): it may change any attendee's details, as the admin may,
where an integration changes only its own attendees'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django import forms
from django.db import transaction
from django.db.models import Count, OuterRef, Q, Subquery

from intake import csvfile
from intake.models import AttendeeRef, Integration
from intake.services import EnrolmentIn, Refused, enrolments_upsert
from reminders.models import Reminder
from workshops.models import Enrollment, Workshop

# A row cancelled in the file: its outcome in the preview, and why.
SKIPPED = "Not enrolled: cancelled in the file"
SKIPPED_WHY = (
    f"its {csvfile.STATUS} is cancelled, so nothing is written for it: if they should come "
    "after all, enrol them on the workshop's page"
)


class ImportForm(forms.Form):
    file = forms.FileField(
        label="CSV file",
        required=False,
        allow_empty_file=True,  # refused by csvfile, with what to do
        help_text=f"Columns: {', '.join(csvfile.COLUMNS)} (name and email required), with a "
        f"header row; UTF-8; at most {csvfile.MAX_ROWS:,} rows.",
    )
    # The previewed file's text, as it was: a leading tab is its first (empty) cell.
    csv_text = forms.CharField(widget=forms.HiddenInput, required=False, strip=False)
    filename_seen = forms.CharField(widget=forms.HiddenInput, required=False)
    integration = forms.CharField(
        max_length=100,
        initial="csv",
        help_text="Whose ids the external_id column holds: 'csv', or the name of an "
        "integration that uses the API, so that its ids and these name the same people.",
    )

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("file") and not cleaned.get("csv_text"):
            raise forms.ValidationError("Choose a CSV file to upload.")
        if cleaned.get("integration") is not None:
            cleaned["integration"] = cleaned["integration"].strip()
            if not cleaned["integration"]:
                self.add_error("integration", "Name whose ids the file holds, e.g. 'csv'.")
        return cleaned

    def file_bytes(self) -> bytes:
        if not hasattr(self, "_bytes"):
            upload = self.cleaned_data.get("file")
            if upload is not None:
                self._bytes = upload.read(csvfile.MAX_BYTES + 1)
            else:
                self._bytes = self.cleaned_data["csv_text"].encode("utf-8")
        return self._bytes

    def filename(self) -> str:
        upload = self.cleaned_data.get("file")
        return (upload.name if upload is not None else self.cleaned_data["filename_seen"])[:255]


@dataclass(slots=True)
class PreviewRow:
    line: int  # the line of the file the row starts on
    name: str
    email: str
    outcome: str
    reasons: list[str] = field(default_factory=list)  # why it is invalid
    note: str = ""  # why a valid row is not enrolled


@dataclass(slots=True)
class Preview:
    rows: list[PreviewRow]
    invalid: int
    counts: dict[str, int]
    skipped: int = 0  # rows cancelled in the file


def _label(outcome: str, attendee_outcome: str) -> str:
    if outcome == "unchanged":
        return "Already enrolled" + (" (details updated)" if attendee_outcome == "updated" else "")
    return {
        "created": "New attendee, enrolled",
        "updated": "Existing attendee (details updated), enrolled",
        "unchanged": "Existing attendee, enrolled",
    }[attendee_outcome]


def _dry_run(integration_name: str, items: list[EnrolmentIn]):
    with transaction.atomic():
        integration, _ = Integration.objects.get_or_create(name=integration_name)
        try:
            return enrolments_upsert(
                integration=integration, items=items, limit=csvfile.MAX_ROWS, by_staff=True
            )
        finally:
            transaction.set_rollback(True)


def import_preview(
    integration_name: str,
    items: list[EnrolmentIn],
    lines: list[int],
    skipped: list[csvfile.Row] = (),
) -> Preview:
    """Each row's outcome if the import ran now: invalid rows with every reason. ``lines``:
    each item's line in the file; ``skipped``: the rows cancelled in the file, not items."""
    reasons: dict[int, list[str]] = {}
    try:
        results = {r.index: r for r in _dry_run(integration_name, items)}
    except Refused as refused:
        for error in refused.errors:
            where = error.field.removeprefix("attendee.")
            detail = error.row_detail or error.detail  # of rows where the API's is of items
            reasons.setdefault(error.index, []).append(f"{where}: {detail}")
        valid = [i for i in range(len(items)) if i not in reasons]
        results = {}
        try:
            found = _dry_run(integration_name, [items[i] for i in valid]) if valid else []
            results = {valid[r.index]: r for r in found}
        except Refused:
            pass  # the valid rows' outcomes depend on the invalid ones; shown as unknown
    rows, counts = [], {}
    named: set[int] = set()  # attendees an earlier row enrols
    for index, item in enumerate(items):
        if index in reasons:
            outcome = "Invalid"
        elif index in results and results[index].attendee_id in named:
            outcome = "Same attendee as an earlier row"  # enrolled once, not 'already'
        elif index in results:
            named.add(results[index].attendee_id)
            outcome = _label(results[index].outcome, results[index].attendee_outcome)
        else:
            outcome = "Valid (outcome shown once the invalid rows are fixed)"
        counts[outcome] = counts.get(outcome, 0) + 1
        rows.append(
            PreviewRow(
                lines[index],
                item.attendee.name or "",
                item.attendee.email,
                outcome,
                reasons.get(index, []),
            )
        )
    for row in skipped:
        counts[SKIPPED] = counts.get(SKIPPED, 0) + 1
        rows.append(
            PreviewRow(
                row.line, row.attendee.name or "", row.attendee.email, SKIPPED, [], SKIPPED_WHY
            )
        )
    rows.sort(key=lambda row: row.line)
    return Preview(rows, len(reasons), counts, len(skipped))


def export_rows(workshop: Workshop, *, integration: str) -> tuple[tuple[str, ...], list[tuple]]:
    """The workshop's enrolments (every status) with their attendee and reminder, by email."""
    reminder = Reminder.objects.filter(attendee=OuterRef("attendee"), workshop=OuterRef("workshop"))
    enrolments = (
        Enrollment.objects.filter(workshop=workshop)
        .select_related("attendee")
        .annotate(
            external_id=Subquery(
                AttendeeRef.objects.filter(
                    integration__name=integration, attendee=OuterRef("attendee")
                ).values("external_id")[:1]
            ),
            reminder_status=Subquery(reminder.values("status")[:1]),
            reminder_reason=Subquery(reminder.values("status_reason")[:1]),
            reminder_sent_at=Subquery(reminder.values("sent_at")[:1]),
            notices_sent=Count(
                "attendee__notices",
                filter=Q(attendee__notices__workshop=workshop, attendee__notices__status="sent"),
            ),
        )
        .order_by("attendee__email")
    )
    rows = [
        (
            e.attendee.name,
            e.attendee.email,
            e.attendee.language,
            e.attendee.timezone,
            e.external_id or "",
            e.status,
            e.reminder_status or "not planned yet",
            e.reminder_reason or "",
            e.reminder_sent_at.isoformat() if e.reminder_sent_at else "",
            e.notices_sent,
        )
        for e in enrolments
    ]
    return csvfile.EXPORT_COLUMNS, rows
