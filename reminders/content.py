"""Render a claimed reminder or change notice as a delivery envelope (sync, before any async work).

The body is the reminder's frozen text (MessageText) filled with the facts as
they are now. Times are in the attendee's zone, else the workshop's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parseaddr
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils import translation
from django.utils.dates import MONTHS, WEEKDAYS
from django.utils.html import escape
from django.utils.translation import gettext, gettext_noop, pgettext

from delivery.addresses import address_problem
from delivery.envelope import Attachment, Envelope, FrozenMap
from delivery.message import key_digest
from reminders.links import attendance_url, unsubscribe_url
from reminders.models import (
    MessageText,
    Notice,
    Reminder,
    WorkshopRevision,
    notice_key,
    reminder_key,
)
from reminders.policy import ReminderPolicy
from workshops.placeholders import fill

# Translated in locale/; frozen into MessageText as they read at the first claim.
DEFAULT_SUBJECT = gettext_noop("Reminder: {workshop_title} starts {start_local}")
DEFAULT_INTRO = gettext_noop(
    'Hello {attendee_name},\n\nthis is a reminder that "{workshop_title}" starts on {start_local}.'
)
Source = MessageText.Source


def warm_up() -> None:
    """Load every language's words (before a worker's pool forks, so children share them)."""
    for code, _name in settings.LANGUAGES:
        _words(code)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# RFC 5322 asks for 78 characters at most; 72 leaves room for a reply's quoting.
TEXT_WIDTH = 72


def wrap_text(text: str) -> str:
    """Wrap each line at TEXT_WIDTH, never inside a word: a long link keeps a line of its own."""
    wrapped = []
    for line in text.splitlines():
        if len(line) <= TEXT_WIDTH:
            wrapped.append(line)
            continue
        # Greedy, word by word: textwrap is too slow per reminder.
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


def text_digest(
    *, language: str, subject_source: str, subject: str, intro_source: str, intro: str
) -> str:
    """Return the digest MessageText rows are shared by: one per distinct language and text."""
    fields = [language, subject_source, subject, intro_source, intro]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


def reminder_language(*, workshop, attendee) -> str:
    """Return the language a reminder is written in: the attendee's, else the workshop's."""
    known = {code for code, _name in settings.LANGUAGES}
    for code in (attendee.language, workshop.language):
        if code in known:
            return code
    return settings.LANGUAGE_CODE


def language_name(code: str) -> str:
    """Return the name settings.LANGUAGES gives ``code``, else the code itself."""
    return dict(settings.LANGUAGES).get(code, code)


def choose_text(*, workshop, attendee, texts=None) -> MessageText:
    """Return the unsaved MessageText ``attendee`` would get for ``workshop`` if claimed now.

    The workshop's text in the attendee's language, else its own; a blank subject
    or intro is the built-in one. ``texts`` maps languages to WorkshopText rows.
    """
    language = reminder_language(workshop=workshop, attendee=attendee)
    if texts is None:
        texts = {text.language: text for text in workshop.texts.all()} if workshop.pk else {}
    own = texts.get(language) if language != workshop.language else None
    source, holder = (Source.LANGUAGE, own) if own is not None else (Source.WORKSHOP, workshop)
    words = _words(language)
    subject, subject_source = holder.reminder_subject, source
    if not subject.strip():
        subject, subject_source = words.default_subject, Source.BUILT_IN
    intro, intro_source = holder.reminder_intro, source
    if not intro.strip():
        intro, intro_source = words.default_intro, Source.BUILT_IN
    fields = {
        "language": language,
        "subject_source": subject_source,
        "subject": subject,
        "intro_source": intro_source,
        "intro": intro.replace("\r\n", "\n").strip("\n"),
    }
    return MessageText(digest=text_digest(**fields), **fields)


def local_start(moment: datetime, zone: ZoneInfo, language: str = "en") -> str:
    """Return ``moment`` as a reminder shows a start: local to ``zone``, with its abbreviation."""
    return _when(moment.astimezone(zone), _words(language))


# The fixed lines' labels, looked up once per language and process (_words).
LABELS = {
    "when": gettext_noop("When:"),
    "until": gettext_noop("Until:"),
    "where": gettext_noop("Where:"),
    "join": gettext_noop("Join:"),
    "organiser": gettext_noop("Organiser:"),
    "reply": gettext_noop("reply to this message to reach them"),
    "calendar": gettext_noop("The attached calendar file adds it to your calendar."),
    "goodbye": gettext_noop("See you there!"),
    "cant_attend": gettext_noop("Can't attend? Let us know:"),
}
ELSEWHERE = gettext_noop(", which is %(start_workshop)s where it is held (%(workshop_zone)s)")


@dataclass(frozen=True, slots=True)
class _Words:
    """One language's texts, labels, date formats and names, looked up once per process."""

    default_subject: str
    default_intro: str
    labels: dict
    html_labels: dict
    elsewhere: str
    held_in: str
    start_format: tuple
    end_format: tuple
    weekdays: tuple
    months: tuple


@functools.cache
def _words(language: str) -> _Words:
    with translation.override(language):
        labels = {name: gettext(text) for name, text in LABELS.items()}
        return _Words(
            default_subject=gettext(DEFAULT_SUBJECT),
            default_intro=gettext(DEFAULT_INTRO),
            labels=labels,
            html_labels={name: escape(text) for name, text in labels.items()},
            elsewhere=gettext(ELSEWHERE),
            held_in=gettext("Held in {zone}."),
            # Translators: a Django date format (https://docs.djangoproject.com/en/5.2/ref/templates/builtins/#date);
            # only l, d, j, F, Y, H and i are understood, and \ quotes a letter.
            start_format=_parse(pgettext("reminder start", r"l d F Y \a\t H:i")),
            # Translators: a Django time format, the end of a workshop that ends on the day it starts.
            end_format=_parse(pgettext("reminder end", "H:i")),
            weekdays=tuple(str(WEEKDAYS[day]) for day in range(7)),
            months=tuple(str(MONTHS[month]) for month in range(1, 13)),
        )


_CODES = frozenset("ldjFYHi")


def _parse(fmt: str) -> tuple[tuple[str, str], ...]:
    """Split a Django date format into (code, "") and ("", literal) parts.

    Only the _CODES are understood; a backslash quotes the next character.
    """
    parts: list[tuple[str, str]] = []
    quoted = False
    for char in fmt:
        if char == "\\" and not quoted:
            quoted = True
            continue
        if char in _CODES and not quoted:
            parts.append((char, ""))
        elif parts and not parts[-1][0]:
            parts[-1] = ("", parts[-1][1] + char)
        else:
            parts.append(("", char))
        quoted = False
    return tuple(parts)


def _format(local: datetime, parts: tuple[tuple[str, str], ...], words: _Words) -> str:
    """Format ``local`` by parsed parts, with day and month names from ``words``."""
    fields = {
        "l": words.weekdays[local.weekday()],
        "d": f"{local.day:02d}",
        "j": str(local.day),
        "F": words.months[local.month - 1],
        "Y": str(local.year),
        "H": f"{local.hour:02d}",
        "i": f"{local.minute:02d}",
    }
    return "".join(fields[code] if code else literal for code, literal in parts)


def _when(local: datetime, words: _Words) -> str:
    return f"{_format(local, words.start_format, words)} {local.tzname()}"


def _until(local_end: datetime, local_start: datetime, words: _Words) -> str:
    if local_end.date() != local_start.date():
        return _when(local_end, words)
    return f"{_format(local_end, words.end_format, words)} {local_end.tzname()}"


def _bdi(value: str) -> str:
    """Escape and isolate a value, so a right-to-left name cannot reorder its line."""
    return f"<bdi>{escape(value)}</bdi>"


def _intro_html(escaped: str) -> str:
    """Return the intro, already filled and escaped, as HTML paragraphs with its line breaks."""
    paragraphs = [part for part in re.split(r"\n\s*\n", escaped) if part.strip()]
    return "\n".join(f"<p>{paragraph.replace(chr(10), '<br>')}</p>" for paragraph in paragraphs)


def _organiser_line(values: dict[str, str], *, html: bool) -> str:
    name, email = values["organiser"], values["organiser_email"]
    if html:
        name, email = (_bdi(name) if name else ""), escape(email)
    if name and email:
        return f"{name} &lt;{email}&gt;" if html else f"{name} <{email}>"
    return name or email


def _text_body(text, values: dict[str, str], words: _Words, *, elsewhere: str) -> str:
    """Return the plain text part: the filled intro, then the fixed lines."""
    label = words.labels
    lines = [
        fill(text.intro, values),
        "",
        f"{label['when']} {values['start_local']} ({values['zone']}){elsewhere}",
        f"{label['until']} {values['end_local']}",
    ]
    if values["location"]:
        lines.append(f"{label['where']} {values['location']}")
    if values["join_url"]:
        lines.append(f"{label['join']} {values['join_url']}")
    if values["organiser"] or values["organiser_email"]:
        who = _organiser_line(values, html=False)
        lines.append(f"{label['organiser']} {who} ({label['reply']})")
    lines += ["", label["calendar"]]
    if values.get("attendance_url"):
        lines += ["", f"{label['cant_attend']} {values['attendance_url']}"]
    lines += ["", label["goodbye"]]
    return "\n".join(lines) + "\n"


def _html_body(text, values: dict[str, str], words: _Words, *, elsewhere: str) -> str:
    """Return the HTML part: inline styles only, everything escaped, names in <bdi>."""
    label = words.html_labels
    details = [
        f"<strong>{label['when']}</strong> {escape(values['start_local'])} "
        f"({escape(values['zone'])}){escape(elsewhere)}",
        f"<strong>{label['until']}</strong> {escape(values['end_local'])}",
    ]
    if values["location"]:
        details.append(f"<strong>{label['where']}</strong> {_bdi(values['location'])}")
    if values["join_url"]:
        url = escape(values["join_url"])
        details.append(
            f'<strong>{label["join"]}</strong> <a href="{url}" style="color: #1a5fb4">{url}</a>'
        )
    if values["organiser"] or values["organiser_email"]:
        who = _organiser_line(values, html=True)
        details.append(f"<strong>{label['organiser']}</strong> {who} ({label['reply']})")
    intro = _intro_html(fill(text.intro, values, literal=escape, value=_bdi))
    lines = "<br>\n".join(details)
    return (
        "<!doctype html>\n"
        f'<html lang="{escape(text.language)}">\n'
        '<body style="font-family: sans-serif; line-height: 1.5">\n'
        f"{intro}\n"
        f"<p>{lines}</p>\n"
        f"<p>{label['calendar']}</p>\n"
        f"{_attendance_html(values, label)}"
        f"<p>{label['goodbye']}</p>\n"
        "</body>\n"
        "</html>\n"
    )


def _attendance_html(values: dict[str, str], label: dict) -> str:
    url = values.get("attendance_url")
    if not url:
        return ""
    url = escape(url)
    return f'<p>{label["cant_attend"]} <a href="{url}" style="color: #1a5fb4">{url}</a></p>\n'


def reminder_envelope(*, reminder: Reminder, text=None, send_by=None) -> Envelope:
    """Return the envelope for a reminder whose attendee and workshop are loaded.

    The text is ``text``, else the frozen one, else what a claim would freeze now. ``send_by``
    (``Claim.send_by``) is not content: the same rows always give byte-identical content.
    """
    attendee, workshop = reminder.attendee, reminder.workshop
    # From the workshop's start, as the claim judges it: no row stores a copy.
    deadline = ReminderPolicy.from_settings().deadline_at(workshop.starts_at)
    if text is None:
        text = reminder.text if reminder.text_id else None
    if text is None:
        text = choose_text(workshop=workshop, attendee=attendee)
    workshop_zone = ZoneInfo(workshop.timezone)
    zone = ZoneInfo(attendee.timezone) if attendee.timezone else workshop_zone
    start, end = workshop.starts_at.astimezone(zone), workshop.ends_at.astimezone(zone)
    location, join_url = _one_line(workshop.location), _join_url(workshop.join_url)
    organiser = _one_line(workshop.contact_name)
    words = _words(text.language)
    values = {
        "attendee_name": attendee.name,
        "workshop_title": workshop.title,
        "start_local": _when(start, words),
        "end_local": _until(end, start, words),
        "zone": zone.key,
        "location": location,
        "join_url": join_url,
        "organiser": organiser,
        "organiser_email": workshop.contact_email,
        # Not a placeholder: the fixed line under the calendar's (a preview has no row).
        "attendance_url": attendance_url(reminder.pk) if reminder.pk else "",
    }
    elsewhere = ""
    if zone.key != workshop_zone.key:
        elsewhere = words.elsewhere % {
            "start_workshop": _when(workshop.starts_at.astimezone(workshop_zone), words),
            "workshop_zone": workshop_zone.key,
        }
    subject = _one_line(fill(text.subject, values))
    text_body = wrap_text(_text_body(text, values, words, elsewhere=elsewhere))
    html_body = _html_body(text, values, words, elsewhere=elsewhere)
    ics = workshop_ics(reminder=reminder, language=text.language)
    details = {
        name: value
        for name, value in (
            ("location", location),
            ("join_url", join_url),
            ("reply_to", workshop.contact_email),
            ("attendance_url", values["attendance_url"]),
        )
        if value
    }
    return Envelope(
        reminder_id=reminder.pk,
        key=reminder.key,
        recipient=attendee.email,
        recipient_name=_one_line(attendee.name),
        subject=subject,
        text_body=text_body,
        html_body=html_body,
        attachments=(
            Attachment(filename="workshop.ics", content_type="text/calendar", content=ics),
        ),
        calendar_method="PUBLISH",
        deadline_at=deadline,
        send_by=send_by,
        payload=FrozenMap(
            {
                "reminder_id": str(reminder.pk),
                "workshop_id": str(workshop.pk),
                "workshop_title": _one_line(workshop.title),
                "starts_at": workshop.starts_at.astimezone(UTC).isoformat(),
                "ends_at": workshop.ends_at.astimezone(UTC).isoformat(),
                "workshop_timezone": workshop_zone.key,
                "attendee_timezone": zone.key,
                "deadline_at": deadline.isoformat(),
                "language": text.language,
                "calendar_method": "PUBLISH",
                **details,
            }
        ),
        reply_to=workshop.contact_email,
        reply_to_name=organiser,
        list_id=list_id(),
        unsubscribe_url=unsubscribe_url(reminder.pk) if reminder.pk else "",
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


# Every line break str.splitlines() knows.
_ICS_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Other controls are not allowed in a TEXT value (RFC 5545, 3.1).
_ICS_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")


def _ics_text(value: str) -> str:
    """Escape text for an iCalendar value (RFC 5545, 3.3.11): no value can break its line."""
    value = value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,")
    return _ICS_CONTROLS.sub("", _ICS_BREAKS.sub("\\\\n", value))


def _ics_param(value: str) -> str:
    """Return text as a quoted iCalendar parameter value (RFC 5545, 3.2): no quotes, one line."""
    text = _ICS_CONTROLS.sub("", _ICS_BREAKS.sub(" ", value)).replace('"', "'").strip()
    return f'"{text}"' if text else ""


def _fold(line: str) -> str:
    """Fold a content line at 75 octets without splitting a UTF-8 character."""
    if len(line) <= 75 and (line.isascii() or len(line.encode()) <= 75):
        return line
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


def sender_mailbox() -> tuple[str, str]:
    """Return DEFAULT_FROM_EMAIL as (name, address)."""
    return _parsed_mailbox(settings.DEFAULT_FROM_EMAIL)


@functools.lru_cache(maxsize=8)
def _parsed_mailbox(value: str) -> tuple[str, str]:
    # Parsed once per value: parseaddr took a fifth of rendering a reminder.
    return parseaddr(value)


@dataclass(frozen=True, slots=True)
class Event:
    """What a calendar file says of a workshop: its facts as one message tells them."""

    title: str
    starts_at: datetime
    ends_at: datetime
    timezone: str
    location: str
    join_url: str
    contact_name: str
    contact_email: str


def event_of(workshop) -> Event:
    return Event(
        title=workshop.title,
        starts_at=workshop.starts_at,
        ends_at=workshop.ends_at,
        timezone=workshop.timezone,
        location=workshop.location,
        join_url=workshop.join_url,
        contact_name=workshop.contact_name,
        contact_email=workshop.contact_email,
    )


def calendar_uid(key: str) -> str:
    """Return the calendar UID of the reminder with ``key``: its notices carry the same one."""
    return f"{key_digest(key)}@workshop-reminders"


def event_ics(
    *,
    uid: str,
    event: Event,
    stamp: datetime,
    sequence: int = 0,
    method: str = "PUBLISH",
    language: str | None = None,
    attendee: tuple[str, str] | None = None,
) -> bytes:
    """Return an iCalendar object (RFC 5545) for one message about ``event``.

    ``uid`` and ``sequence`` let a later message update the entry an earlier one made (RFC 5546):
    an attendee's messages share one UID, each change notice a higher SEQUENCE. ``method`` is
    PUBLISH (the entry as it is now) or CANCEL, which also says STATUS:CANCELLED and names
    ``attendee`` (name, address). ORGANIZER is the workshop's organiser, else the sender.
    """
    words = _words(language or settings.LANGUAGE_CODE)
    held_in = words.held_in.replace("{zone}", event.timezone)
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//Workshop Reminders//EN",
        f"METHOD:{method}",
        "BEGIN:VEVENT",
        f"UID:{uid}",
        # Fixed per message, so one idempotency key always carries identical bytes.
        f"DTSTAMP:{_ics_time(stamp)}",
        f"SEQUENCE:{sequence}",
        f"DTSTART:{_ics_time(event.starts_at)}",
        f"DTEND:{_ics_time(event.ends_at)}",
        f"SUMMARY:{_ics_text(event.title)}",
        f"DESCRIPTION:{_ics_text(held_in)}",
        f"STATUS:{'CANCELLED' if method == 'CANCEL' else 'CONFIRMED'}",
    ]
    if event.location:
        lines.append(f"LOCATION:{_ics_text(event.location)}")
    if _join_url(event.join_url):
        lines.append(f"URL:{event.join_url}")  # a URI value: printable, one line, no escaping
    name, address = event.contact_name, event.contact_email
    if not address or address_problem(address) is not None:
        # RFC 5546 asks for an ORGANIZER in every PUBLISH and CANCEL: the sender then.
        name, address = sender_mailbox()
    cn = _ics_param(name)
    lines.append(f"ORGANIZER{f';CN={cn}' if cn else ''}:mailto:{address}")
    if attendee is not None:
        cn = _ics_param(attendee[0])
        lines.append(f"ATTENDEE{f';CN={cn}' if cn else ''}:mailto:{attendee[1]}")
    lines += [
        "END:VEVENT",
        "END:VCALENDAR",
    ]
    return ("\r\n".join(_fold(line) for line in lines) + "\r\n").encode()


def workshop_ics(*, reminder: Reminder, language: str | None = None) -> bytes:
    """Return the reminder's .ics: its workshop as it is now, SEQUENCE 0, in ``language``."""
    return event_ics(
        uid=calendar_uid(reminder.key),
        event=event_of(reminder.workshop),
        stamp=reminder.created_at,
        language=language,
    )


# Change notices (reminders.services.notices): the same envelope, told as news.
# Subjects and intros per kind; translated in locale/, frozen at the first claim.
NOTICE_SUBJECTS = {
    "changed": gettext_noop("Changed: {workshop_title}, now {start_local}"),
    "cancelled": gettext_noop("Cancelled: {workshop_title} on {old_start_local}"),
    "reinstated": gettext_noop("Back on: {workshop_title}, {start_local}"),
}
NOTICE_INTROS = {
    "changed": gettext_noop(
        'Hello {attendee_name},\n\n"{workshop_title}" has changed since we reminded you. '
        "Here is what is different."
    ),
    "cancelled": gettext_noop(
        'Hello {attendee_name},\n\nwe are sorry: "{workshop_title}", which was to start on '
        "{old_start_local}, is cancelled."
    ),
    "reinstated": gettext_noop(
        'Hello {attendee_name},\n\n"{workshop_title}" is back on: it takes place after all.'
    ),
}
NOTICE_LABELS = {
    "changed": gettext_noop("What changed:"),
    "was": gettext_noop("was"),
    "none": gettext_noop("none"),
    "reason": gettext_noop("Reason given:"),
    "update": gettext_noop("The attached calendar file updates the entry in your calendar."),
    "remove": gettext_noop("The attached calendar file removes it from your calendar."),
}


@functools.cache
def _notice_words(language: str) -> dict[str, str]:
    with translation.override(language):
        words = {f"subject_{kind}": gettext(text) for kind, text in NOTICE_SUBJECTS.items()}
        words |= {f"intro_{kind}": gettext(text) for kind, text in NOTICE_INTROS.items()}
        return words | {name: gettext(text) for name, text in NOTICE_LABELS.items()}


def choose_notice_text(*, workshop, attendee, kind: str) -> MessageText:
    """Return the unsaved MessageText of a change notice of ``kind`` for ``attendee``.

    The built-in subject of the kind; the workshop's own notice intro for an
    attendee reading the workshop's language, else the built-in one.
    """
    language = reminder_language(workshop=workshop, attendee=attendee)
    words = _notice_words(language)
    intro, source = words[f"intro_{kind}"], Source.BUILT_IN
    if language == workshop.language and workshop.notice_intro.strip():
        intro, source = workshop.notice_intro, Source.WORKSHOP
    fields = {
        "language": language,
        "subject_source": Source.BUILT_IN,
        "subject": words[f"subject_{kind}"],
        "intro_source": source,
        "intro": intro.replace("\r\n", "\n").strip("\n"),
    }
    return MessageText(digest=text_digest(**fields), **fields)


def notice_envelope(*, notice, text=None, send_by=None) -> Envelope:
    """Return the envelope of a change notice whose attendee, workshop, revision and reminder
    are loaded: the revision's facts, what the attendee had been told, and a calendar
    update under the reminder's UID with the revision's number as SEQUENCE."""
    attendee, workshop, revision = notice.attendee, notice.workshop, notice.revision
    text = (
        text
        or notice.text
        or choose_notice_text(workshop=workshop, attendee=attendee, kind=notice.kind)
    )
    words, news = _words(text.language), _notice_words(text.language)
    workshop_zone = ZoneInfo(workshop.timezone)
    zone = ZoneInfo(attendee.timezone) if attendee.timezone else workshop_zone
    start, end = revision.starts_at.astimezone(zone), revision.ends_at.astimezone(zone)
    values = {
        "attendee_name": attendee.name,
        "workshop_title": workshop.title,
        "start_local": _when(start, words),
        "end_local": _until(end, start, words),
        "zone": zone.key,
        "location": _one_line(revision.location),
        "join_url": _join_url(revision.join_url),
        "organiser": _one_line(workshop.contact_name),
        "organiser_email": workshop.contact_email,
        "old_start_local": "",
        "old_end_local": "",
        "old_location": _one_line(notice.old_location),
        "old_join_url": _join_url(notice.old_join_url),
        "cancellation_reason": _one_line(revision.cancellation_reason),
    }
    if notice.old_starts_at is not None:
        old_start = notice.old_starts_at.astimezone(zone)
        values["old_start_local"] = _when(old_start, words)
        if notice.old_ends_at is not None:
            values["old_end_local"] = _until(notice.old_ends_at.astimezone(zone), old_start, words)
    cancelled = notice.kind == "cancelled"
    lines = [fill(text.intro, values), ""]
    if cancelled:
        if values["cancellation_reason"]:
            lines += [f"{news['reason']} {values['cancellation_reason']}", ""]
    else:
        label = words.labels
        changes = []
        for name, key in (
            ("when", "start_local"),
            ("until", "end_local"),
            ("where", "location"),
            ("join", "join_url"),
        ):
            old = values[f"old_{key}"]
            if values[key] != old:
                new_value = values[key] or news["none"]
                changes.append(f"{label[name]} {new_value} ({news['was']} {old or news['none']})")
        if changes:
            lines += [news["changed"], *changes, ""]
        lines.append(f"{label['when']} {values['start_local']} ({values['zone']})")
        lines.append(f"{label['until']} {values['end_local']}")
        if values["location"]:
            lines.append(f"{label['where']} {values['location']}")
        if values["join_url"]:
            lines.append(f"{label['join']} {values['join_url']}")
        lines.append("")
    lines.append(news["remove"] if cancelled else news["update"])
    links = attendance_url(notice.reminder_id) if notice.pk and not cancelled else ""
    if links:
        lines += ["", f"{words.labels['cant_attend']} {links}"]
    text_body = wrap_text("\n".join(lines) + "\n")
    html_body = (
        "<!doctype html>\n"
        f'<html lang="{escape(text.language)}">\n'
        '<body style="font-family: sans-serif; line-height: 1.5">\n'
        + "".join(f"<p>{escape(part).replace(chr(10), '<br>')}</p>\n"
                  for part in "\n".join(lines).split("\n\n") if part.strip())
        + "</body>\n</html>\n"
    )  # fmt: skip
    event = Event(
        title=workshop.title,
        starts_at=revision.starts_at,
        ends_at=revision.ends_at,
        timezone=workshop.timezone,
        location=revision.location,
        join_url=revision.join_url,
        contact_name=workshop.contact_name,
        contact_email=workshop.contact_email,
    )
    method = "CANCEL" if cancelled else "PUBLISH"
    ics = event_ics(
        uid=calendar_uid(notice.reminder.key),
        event=event,
        stamp=revision.created_at,
        sequence=notice.number,
        method=method,
        language=text.language,
        attendee=(_one_line(attendee.name), attendee.email) if cancelled else None,
    )
    return Envelope(
        reminder_id=notice.pk,
        key=notice.key,
        recipient=attendee.email,
        recipient_name=_one_line(attendee.name),
        subject=_one_line(fill(text.subject, values)),
        text_body=text_body,
        html_body=html_body,
        attachments=(
            Attachment(filename="workshop.ics", content_type="text/calendar", content=ics),
        ),
        calendar_method=method,
        kind="notice",
        deadline_at=workshop.starts_at,
        send_by=send_by,
        payload=FrozenMap(
            {
                "notice_id": str(notice.pk),
                "reminder_id": str(notice.reminder_id),
                "workshop_id": str(workshop.pk),
                "kind": notice.kind,
                "revision": str(notice.number),
                "workshop_title": _one_line(workshop.title),
                "starts_at": revision.starts_at.astimezone(UTC).isoformat(),
                "ends_at": revision.ends_at.astimezone(UTC).isoformat(),
                "workshop_timezone": workshop_zone.key,
                "attendee_timezone": zone.key,
                "language": text.language,
                "calendar_method": method,
                **({"attendance_url": links} if links else {}),
            }
        ),
        reply_to=workshop.contact_email,
        reply_to_name=_one_line(workshop.contact_name),
        list_id=list_id(),
        unsubscribe_url=unsubscribe_url(notice.reminder_id) if notice.pk else "",
    )


@dataclass(frozen=True, slots=True)
class Preview:
    """What an attendee would get: the envelope, its text, and whether that text is frozen."""

    envelope: Envelope
    text: MessageText
    frozen: bool


def reminder_preview(*, workshop, attendee, now: datetime) -> Preview:
    """Return what ``attendee`` would get for ``workshop`` if it were sent at ``now`` (read only).

    The planned reminder if any (the very bytes), else an unsaved one with its key, made ``now``.
    """
    reminder = (
        Reminder.objects.filter(workshop=workshop, attendee=attendee).select_related("text").first()
    )
    if reminder is None:
        reminder = Reminder(
            pk=0,
            key=reminder_key(attendee_id=attendee.pk, workshop_id=workshop.pk),
            created_at=now,
        )
    reminder.workshop, reminder.attendee = workshop, attendee
    frozen = reminder.text_id is not None
    text = reminder.text if frozen else choose_text(workshop=workshop, attendee=attendee)
    return Preview(
        envelope=reminder_envelope(reminder=reminder, text=text), text=text, frozen=frozen
    )


def preview_envelope(*, workshop, attendee, now: datetime) -> Envelope:
    """Return the envelope of reminder_preview (what a test send sends)."""
    return reminder_preview(workshop=workshop, attendee=attendee, now=now).envelope


def notice_preview(*, workshop, attendee, now: datetime) -> Preview:
    """Return the change notice ``attendee`` would get for ``workshop`` as it is at ``now``.

    "From" is what their reminder (or last notice) told them, else the workshop as it is (a
    sample of the layout, nothing marked changed). Read only: nothing is numbered or stored.
    """
    reminder = Reminder.objects.filter(workshop=workshop, attendee=attendee).first()
    if reminder is None:
        reminder = Reminder(
            pk=0,
            key=reminder_key(attendee_id=attendee.pk, workshop_id=workshop.pk),
            created_at=now,
        )
    enrolled = workshop.enrollments.filter(attendee=attendee, status="active").exists()
    cancelled = workshop.status == "cancelled" or not enrolled
    told = reminder.told_starts_at is not None
    if cancelled:
        kind = "cancelled"
    else:
        kind = "reinstated" if told and reminder.told_cancelled else "changed"
    latest = workshop.revisions.order_by("-number").values_list("number", flat=True).first()
    revision = WorkshopRevision(
        workshop=workshop,
        number=(latest or 0) + 1,
        starts_at=workshop.starts_at,
        ends_at=workshop.ends_at,
        location=workshop.location,
        join_url=workshop.join_url,
        cancelled=workshop.status == "cancelled",
        cancellation_reason=workshop.cancellation_reason,
        created_at=now,
        settles_at=now,
    )
    notice = Notice(
        pk=0,
        reminder=reminder,
        attendee=attendee,
        workshop=workshop,
        revision=revision,
        number=revision.number,
        kind=kind,
        key=notice_key(attendee_id=attendee.pk, workshop_id=workshop.pk, revision=revision.number),
        old_starts_at=reminder.told_starts_at if told else workshop.starts_at,
        old_ends_at=reminder.told_ends_at if told else workshop.ends_at,
        old_location=reminder.told_location if told else workshop.location,
        old_join_url=reminder.told_join_url if told else workshop.join_url,
    )
    text = choose_notice_text(workshop=workshop, attendee=attendee, kind=kind)
    return Preview(envelope=notice_envelope(notice=notice, text=text), text=text, frozen=False)
