"""Render a claimed reminder into a delivery envelope (sync, before any async work).

Subject and bodies come from Django templates; times are shown in the
attendee's zone (else the workshop's) with the zone's abbreviation for that
date, so a reminder for a workshop on a daylight-saving day says CEST or CET
correctly. An iCalendar file with the start in UTC is attached.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.template.loader import get_template

from delivery.addresses import address_problem
from delivery.envelope import Attachment, Envelope, FrozenMap
from delivery.message import key_digest
from reminders.models import Reminder, reminder_key
from reminders.policy import ReminderPolicy

TIME_FORMAT = "%A %d %B %Y at %H:%M"


@functools.cache
def _template(name: str):
    """Return the compiled template: loaded and parsed once per process, not once per reminder.

    Forgotten when the TEMPLATES setting changes (tests override it); a
    worker reads edited template files at its next start.
    """
    return get_template(name)


@receiver(setting_changed)
def _forget_templates(*, setting: str, **kwargs) -> None:
    if setting == "TEMPLATES":
        _template.cache_clear()


TEMPLATES = ("reminders/email/subject.txt", "reminders/email/body.txt", "reminders/email/body.html")


def compile_templates() -> None:
    """Compile the message templates now (a worker's parent does it before the pool forks)."""
    for name in TEMPLATES:
        _template(name)


def _render(name: str, context: dict) -> str:
    return _template(name).render(context)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# Mail readers show plain text as it comes; lines are wrapped here (RFC 5322
# asks for 78 characters at most; 72 leaves room for a reply's quoting).
TEXT_WIDTH = 72


def wrap_text(text: str) -> str:
    """Wrap each line of ``text`` at TEXT_WIDTH, never inside a word or a link.

    Blank lines (paragraph breaks) stay; a word longer than the width, such as
    a join link, stays whole on a line of its own.
    """
    wrapped = []
    for line in text.splitlines():
        if len(line) <= TEXT_WIDTH:
            wrapped.append(line)
            continue
        # Greedy, word by word: textwrap's chunking cost about 0.1 ms a reminder.
        current = ""
        for word in line.split():
            if not current:
                current = word
            elif len(current) + 1 + len(word) <= TEXT_WIDTH:
                current += " " + word
            else:
                wrapped.append(current)
                current = word
        if current:
            wrapped.append(current)
    return "\n".join(wrapped) + ("\n" if text.endswith("\n") else "")


def reminder_envelope(*, reminder: Reminder) -> Envelope:
    """Return the envelope for a reminder whose attendee and workshop are loaded.

    Deterministic: the same rows give byte-identical content, whenever it runs.
    """
    attendee, workshop = reminder.attendee, reminder.workshop
    workshop_zone = ZoneInfo(workshop.timezone)
    zone = ZoneInfo(attendee.timezone) if attendee.timezone else workshop_zone
    start, end = workshop.starts_at.astimezone(zone), workshop.ends_at.astimezone(zone)
    start_there = workshop.starts_at.astimezone(workshop_zone)
    context = {
        "attendee_name": attendee.name,
        "workshop_title": workshop.title,
        "start_local": start.strftime(TIME_FORMAT),
        "zone_abbr": start.tzname(),
        "zone_name": zone.key,
        "end_local": end.strftime("%H:%M"),
        "end_zone_abbr": end.tzname(),
        "show_workshop_zone": zone.key != workshop_zone.key,
        "start_workshop": start_there.strftime(TIME_FORMAT),
        "workshop_zone_abbr": start_there.tzname(),
        "workshop_zone": workshop_zone.key,
        "location": _one_line(workshop.location),
        "join_url": _join_url(workshop.join_url),
        "organiser": _one_line(workshop.contact_name),
        "organiser_email": workshop.contact_email,
    }
    details = {
        name: value
        for name, value in (
            ("location", context["location"]),
            ("join_url", context["join_url"]),
            ("reply_to", workshop.contact_email),
        )
        if value
    }
    return Envelope(
        reminder_id=reminder.pk,
        key=reminder.key,
        recipient=attendee.email,
        recipient_name=_one_line(attendee.name),
        subject=_one_line(_render("reminders/email/subject.txt", context)),
        text_body=wrap_text(_render("reminders/email/body.txt", context)),
        html_body=_render("reminders/email/body.html", context),
        attachments=(
            Attachment(
                filename="workshop.ics",
                content_type="text/calendar",
                content=workshop_ics(reminder=reminder),
            ),
        ),
        deadline_at=reminder.deadline_at,
        payload=FrozenMap(
            {
                "reminder_id": str(reminder.pk),
                "workshop_id": str(workshop.pk),
                "workshop_title": workshop.title,
                "starts_at": workshop.starts_at.astimezone(UTC).isoformat(),
                "ends_at": workshop.ends_at.astimezone(UTC).isoformat(),
                "workshop_timezone": workshop_zone.key,
                "attendee_timezone": zone.key,
                "deadline_at": reminder.deadline_at.astimezone(UTC).isoformat(),
                **details,
            }
        ),
        reply_to=workshop.contact_email,
        reply_to_name=_one_line(workshop.contact_name),
        list_id=list_id(),
    )


def _join_url(value: str) -> str:
    """Return the join link when it is an https link on one line (the model's rule), else ''."""
    if value.lower().startswith("https://") and value.isprintable() and " " not in value:
        return value
    return ""


def sender_domain() -> str:
    """Return the domain of DEFAULT_FROM_EMAIL (Message-IDs and the List-Id are under it)."""
    address = settings.DEFAULT_FROM_EMAIL.rsplit("<", 1)[-1].rstrip(">").strip()
    return address.rsplit("@", 1)[-1] or "localhost"


def list_id() -> str:
    """Return the List-Id every reminder carries: the sender's domain, under ``reminders.``."""
    return f"Workshop reminders <reminders.{sender_domain()}>"


# Every line break Python's str.splitlines() knows, as one escaped "\\n" each.
_ICS_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Other control characters are not allowed in a TEXT value (RFC 5545, 3.1): dropped.
_ICS_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")


def _ics_text(value: str) -> str:
    """Escape text for an iCalendar property value (RFC 5545, 3.3.11).

    Every kind of line break, Unicode's line and paragraph separators included,
    becomes the escaped ``\\n``; other control characters are dropped (a tab
    stays), so no value can end its line or start a property of its own.
    """
    value = value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,")
    return _ICS_CONTROLS.sub("", _ICS_BREAKS.sub("\\\\n", value))


def _ics_param(value: str) -> str:
    """Return text as a quoted iCalendar parameter value (RFC 5545, 3.2): no quotes, one line."""
    text = _ICS_CONTROLS.sub("", _ICS_BREAKS.sub(" ", value)).replace('"', "'").strip()
    return f'"{text}"' if text else ""


def _fold(line: str) -> str:
    """Fold a content line at 75 octets without splitting a UTF-8 character."""
    if len(line) <= 75 and (line.isascii() or len(line.encode()) <= 75):
        return line  # most lines: nothing to fold
    out, current = [], ""
    for char in line:
        limit = 75 if not out else 74
        if len((current + char).encode()) > limit:
            out.append(current)
            current = char
        else:
            current += char
    out.append(current)
    return "\r\n ".join(out)


def _ics_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def workshop_ics(*, reminder: Reminder) -> bytes:
    """Return an iCalendar (.ics) invitation for the reminder's workshop (deterministic)."""
    workshop = reminder.workshop
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//Workshop Reminders//EN",
        "METHOD:PUBLISH",
        "BEGIN:VEVENT",
        # One event per attendee's copy, stable under its idempotency key.
        f"UID:{key_digest(reminder.key)}@workshop-reminders",
        # When this reminder's invitation was first made: the same on every
        # retry, requeue and replay, so one idempotency key always carries
        # byte-identical content (a receiver may compare key and body).
        f"DTSTAMP:{_ics_time(reminder.created_at)}",
        f"DTSTART:{_ics_time(workshop.starts_at)}",
        f"DTEND:{_ics_time(workshop.ends_at)}",
        f"SUMMARY:{_ics_text(workshop.title)}",
        f"DESCRIPTION:{_ics_text(f'Held in {workshop.timezone}.')}",
    ]
    if workshop.location:
        lines.append(f"LOCATION:{_ics_text(workshop.location)}")
    if _join_url(workshop.join_url):
        lines.append(f"URL:{workshop.join_url}")  # a URI value: printable, one line, no escaping
    if workshop.contact_email and address_problem(workshop.contact_email) is None:
        name = _ics_param(workshop.contact_name)
        lines.append(f"ORGANIZER{f';CN={name}' if name else ''}:mailto:{workshop.contact_email}")
    lines += [
        "END:VEVENT",
        "END:VCALENDAR",
    ]
    return ("\r\n".join(_fold(line) for line in lines) + "\r\n").encode()


def preview_envelope(*, workshop, attendee, now: datetime) -> Envelope:
    """Return the envelope ``attendee`` would get for ``workshop`` if it were sent at ``now``.

    Read only. The planned reminder is used when there is one (its key and
    creation time, so the .ics is the one that would be sent); otherwise an
    unsaved one with the key it would get, made ``now``.
    """
    reminder = Reminder.objects.filter(workshop=workshop, attendee=attendee).first()
    if reminder is None:
        reminder = Reminder(
            pk=0,
            key=reminder_key(attendee_id=attendee.pk, workshop_id=workshop.pk),
            created_at=now,
            deadline_at=ReminderPolicy.from_settings().deadline_at(workshop.starts_at),
        )
    reminder.workshop, reminder.attendee = workshop, attendee
    return reminder_envelope(reminder=reminder)
