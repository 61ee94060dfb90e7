"""Attendee CSV files: read for an import (every refusal says what to do), written for an export.

An import file has a header row naming its columns (any order, case aside):
``name`` and ``email`` are required, ``language``, ``timezone`` and
``external_id`` optional. Comma, semicolon or tab separated, UTF-8 with or
without a byte-order mark, at most MAX_ROWS rows and MAX_BYTES bytes. A blank
optional cell leaves an existing attendee's value as it is. A ' before a
formula start, which the export adds (safe_cell), is taken off again (unquoted).

An exported file imports back as it is: of the export's own columns,
``enrolment_status`` is read (a row it says is cancelled is not to be enrolled)
and the others (INFORMATIONAL) are not read at all. Any other column is refused.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass

from intake.services import AttendeeIn

COLUMNS = ("name", "email", "language", "timezone", "external_id")
REQUIRED = ("name", "email")
# The export's columns past those: the enrolment's status, read (a cancelled row is not
# enrolled, wherever the file is imported), and what the import does not read.
STATUS = "enrolment_status"
INFORMATIONAL = (
    "reminder_status",
    "reminder_status_reason",
    "reminder_sent_at_utc",
    "notices_sent",
)
EXPORT_COLUMNS = (*COLUMNS, STATUS, *INFORMATIONAL)
MAX_ROWS = 5000
# Under Django's 2.5 MB cap on a posted form (DATA_UPLOAD_MAX_MEMORY_SIZE): the preview
# posts the file's text back with the confirmation.
MAX_BYTES = 2 * 1024 * 1024
# Where a spreadsheet would run a formula: a cell starting with one of OWASP's list (the four
# signs, tab, CR), or a part of one after a ';' or a line break, which start a new cell where
# the list separator is ';' (Excel in much of Europe).
FORMULA_START = re.compile(r"(^|[;\n\r])(?=[=+\-@\t\r])")
# The quote safe_cell put there: the import takes it off, so an exported file reads as it was.
QUOTED_FORMULA = re.compile(r"(^|[;\n\r])'(?=[=+\-@\t\r])")
EMPTY = "The file is empty: export the attendee list with a header row first."


class CsvRefused(ValueError):
    """The file as a whole cannot be read; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Row:
    line: int  # of the file, where the row starts (the header's is 1 if it is first)
    attendee: AttendeeIn
    cancelled: bool = False  # its enrolment_status says cancelled: not to be enrolled


@dataclass(frozen=True, slots=True)
class AttendeeFile:
    rows: list[Row]
    ignored: tuple[str, ...]  # the INFORMATIONAL columns the header names, which are not read


def read_attendees(data: bytes) -> AttendeeFile:
    """The attendees a CSV file lists, one per row, in order; CsvRefused if it cannot be read."""
    if not data.strip():
        raise CsvRefused(EMPTY)
    if len(data) > MAX_BYTES:
        raise CsvRefused(
            f"The file is {len(data) / 1048576:.1f} MB; an import takes at most "
            f"{MAX_BYTES // 1048576} MB ({MAX_ROWS:,} rows): split it into smaller files."
        )
    if (
        b"\x00" in data
        or data[:4] in (b"PK\x03\x04", b"%PDF")
        or data[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
    ):
        raise CsvRefused(
            "This is not a CSV file (a spreadsheet or other binary file?): save it from your "
            "spreadsheet as 'CSV UTF-8' and upload that."
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CsvRefused(
            f"The file is not UTF-8 (line {line} has bytes UTF-8 does not allow, as "
            "Latin-1 or Windows-1252 files do): save it as 'CSV UTF-8' and upload again."
        ) from None
    # Blank lines before the header are skipped, as blank lines between rows are.
    first = next((line for line in text.splitlines() if line.strip(' \t,;"')), None)
    if first is None:  # a byte-order mark, blank lines or separators alone
        raise CsvRefused(EMPTY)
    delimiter = max(",;\t", key=first.count)  # the header's separator; Excel's own quoting
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next((cells for cells in reader if any(cell.strip() for cell in cells)), None)
        if header is None:
            raise CsvRefused(EMPTY)
        header = [cell.strip().lower() for cell in header]
        rows = _rows(reader, header)
    except csv.Error as error:
        raise CsvRefused(
            f"The file is not valid CSV at line {reader.line_num} ({error}): check its quotes."
        ) from None
    if not rows:
        raise CsvRefused("The file has a header row but no attendees below it.")
    return AttendeeFile(rows, tuple(name for name in INFORMATIONAL if name in header))


def _rows(reader, header: list[str]) -> list[Row]:
    unknown = [name for name in header if name and name not in EXPORT_COLUMNS]
    missing = [name for name in REQUIRED if name not in header]
    if unknown or missing:
        said = []
        if missing:
            said.append(f"no {' or '.join(missing)} column")
        if unknown:
            said.append(f"unknown columns {', '.join(unknown)}")
        raise CsvRefused(
            f"The header row has {'; '.join(said)}. The first row names the columns: "
            f"{', '.join(COLUMNS)} (name and email required); an exported file's "
            f"other columns ({', '.join(EXPORT_COLUMNS[len(COLUMNS) :])}) may stay."
        )
    named = [name for name in header if name]  # blank ones: columns padded, no data
    if len(set(named)) != len(named):
        raise CsvRefused("The header row names a column twice; name each once.")
    rows = []
    end = reader.line_num  # of the row before: blank lines and line breaks in cells count
    for cells in reader:
        line, end = end + 1, reader.line_num
        if not any(cell.strip() for cell in cells):
            continue  # blank lines (a trailing one, or spacing) are no attendee
        if len(rows) >= MAX_ROWS:
            raise CsvRefused(
                f"The file has more than {MAX_ROWS:,} attendees; an import takes at most "
                f"{MAX_ROWS:,}: split it into smaller files."
            )
        if any(cell.strip() for cell in cells[len(header) :]):  # blank ones are padding
            raise CsvRefused(
                f"Line {reader.line_num} has {len(cells)} cells but the header names "
                f"{len(header)} columns: quote cells that contain the separator."
            )
        if any(cell.strip() for name, cell in zip(header, cells, strict=False) if not name):
            raise CsvRefused(
                f"Line {line} has a value in a column whose header cell is blank: name the "
                f"column ({', '.join(COLUMNS)}) or clear its cells."
            )
        values = {name: unquoted(cell) for name, cell in zip(header, cells, strict=False)}
        attendee = AttendeeIn(
            email=values.get("email", "").strip(),
            name=values.get("name", "").strip(),
            language=values.get("language", "").strip() or None,
            timezone=values.get("timezone", "").strip() or None,
            external_id=values.get("external_id", "").strip() or None,
        )
        status = values.get(STATUS, "").strip().lower()
        if status not in ("", "active", "cancelled"):
            raise CsvRefused(
                f"Line {line} has {STATUS} {values[STATUS].strip()!r}: the export writes active "
                "or cancelled. A cancelled row is not enrolled; make it active, or blank, to "
                "enrol the attendee."
            )
        rows.append(Row(line, attendee, cancelled=status == "cancelled"))
    return rows


def safe_cell(value) -> str:
    """A cell as text that a spreadsheet shows, never runs: a formula start gets a quote, at
    the start and after each ';' or line break."""
    return FORMULA_START.sub(r"\1'", "" if value is None else str(value))


def unquoted(cell: str) -> str:
    """A cell as it was before safe_cell quoted it (a spreadsheet keeps the quote it shows)."""
    return QUOTED_FORMULA.sub(r"\1", cell)


def write_rows(header: Iterable[str], rows: Iterable[Iterable]) -> str:
    """The rows as CSV text for a spreadsheet: after a byte-order mark, which tells Excel that
    it is UTF-8 (without one it reads the system's code page, and 'Émile' shows as 'Ã‰mile')."""
    out = io.StringIO()
    out.write("\ufeff")
    writer = csv.writer(out)
    writer.writerow(list(header))
    for row in rows:
        writer.writerow([safe_cell(cell) for cell in row])
    return out.getvalue()
