"""Render a claimed reminder or change notice as a delivery envelope.

The body is the frozen text (MessageText) filled with the facts as they are
now. Times are in the attendee's zone, else the workshop's.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parseaddr
from urllib.parse import quote
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils import translation
from django.utils.dates import MONTHS, WEEKDAYS
from django.utils.translation import gettext, gettext_noop, pgettext

from delivery.addresses import address_problem, idna_domain
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

Source = MessageText.Source

# Translated in locale/; frozen into MessageText as they read at the first claim.
DEFAULT_SUBJECT = gettext_noop("Reminder: {workshop_title} starts {start_local}")
DEFAULT_INTRO = gettext_noop(
    'Hello {attendee_name},\n\nthis is a reminder that "{workshop_title}" starts on {start_local}.'
)
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

# Change notices (reminders.services.notices) by kind.
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

# RFC 5322 asks for 78 characters at most; 72 leaves room for a reply's quoting.
TEXT_WIDTH = 72


def warm_up() -> None:
    """Load every language's words (before a worker's pool forks, so children share them)."""
    for code, _name in settings.LANGUAGES:
        _words(code)


@dataclass(frozen=True, slots=True)
class _Words:
    """One language's texts, labels, date formats and names."""

    default_subject: str
    default_intro: str
    labels: dict
    html_labels: dict
    notice: dict
    elsewhere: str
    held_in: str
    start_format: tuple
    end_format: tuple
    weekdays: tuple
    months: tuple
    days: tuple


@functools.cache
def _words(language: str) -> _Words:
    with translation.override(language):
        labels = {name: gettext(text) for name, text in LABELS.items()}
        notice = {f"subject_{kind}": gettext(text) for kind, text in NOTICE_SUBJECTS.items()}
        notice |= {f"intro_{kind}": gettext(text) for kind, text in NOTICE_INTROS.items()}
        notice |= {name: gettext(text) for name, text in NOTICE_LABELS.items()}
        return _Words(
            default_subject=gettext(DEFAULT_SUBJECT),
            default_intro=gettext(DEFAULT_INTRO),
            labels=labels,
            html_labels={name: _escape(text) for name, text in labels.items()},
            notice=notice,
            elsewhere=gettext(ELSEWHERE),
            held_in=gettext("Held in {zone}."),
            # Translators: a Django date format (https://docs.djangoproject.com/en/5.2/ref/templates/builtins/#date);
            # only l, d, j, F, Y, H and i are understood, and \ quotes a letter.
            start_format=_parse(pgettext("reminder start", r"l d F Y \a\t H:i")),
            # Translators: a Django time format, the end of a workshop that ends on the day it starts.
            end_format=_parse(pgettext("reminder end", "H:i")),
            weekdays=tuple(str(WEEKDAYS[day]) for day in range(7)),
            months=tuple(str(MONTHS[month]) for month in range(1, 13)),
            # Translators: the first day of a month as the format's "j" writes it in a date.
            days=(pgettext("day of month", "1"), *(str(day) for day in range(2, 32))),
        )


def reminder_language(*, workshop, attendee) -> str:
    """Return the language a message is written in: the attendee's, else the workshop's."""
    known = {code for code, _name in settings.LANGUAGES}
    for code in (attendee.language, workshop.language):
        if code in known:
            return code
    return settings.LANGUAGE_CODE


def language_name(code: str) -> str:
    """Return the name settings.LANGUAGES gives ``code``, else the code itself."""
    return dict(settings.LANGUAGES).get(code, code)


def _message_text(*, language, subject_source, subject, intro_source, intro) -> MessageText:
    """Return an unsaved MessageText with its digest (rows with the same text share one)."""
    fields = {
        "language": language,
        "subject_source": subject_source,
        "subject": subject,
        "intro_source": intro_source,
        "intro": intro.replace("\r\n", "\n").strip("\n"),
    }
    digest = hashlib.sha256(json.dumps(list(fields.values())).encode()).hexdigest()
    return MessageText(digest=digest, **fields)


def choose_text(*, workshop, attendee, texts=None) -> MessageText:
    """Return the unsaved MessageText a claim would freeze now.

    The workshop's text in the attendee's language, else its own; a blank part is the built-in
    one. ``texts`` maps languages to WorkshopText rows.
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
    return _message_text(
        language=language,
        subject_source=subject_source,
        subject=subject,
        intro_source=intro_source,
        intro=intro,
    )


def choose_notice_text(*, workshop, attendee, kind: str) -> MessageText:
    """Return the unsaved MessageText of a change notice of ``kind``."""
    language = reminder_language(workshop=workshop, attendee=attendee)
    words = _words(language).notice
    intro, intro_source = words[f"intro_{kind}"], Source.BUILT_IN
    if language == workshop.language and workshop.notice_intro.strip():
        intro, intro_source = workshop.notice_intro, Source.WORKSHOP
    return _message_text(
        language=language,
        subject_source=Source.BUILT_IN,
        subject=words[f"subject_{kind}"],
        intro_source=intro_source,
        intro=intro,
    )


def local_start(moment: datetime, zone: ZoneInfo, language: str = "en") -> str:
    """Return ``moment`` as a message shows a start: local to ``zone``, with its abbreviation."""
    return _when(moment.astimezone(zone), _words(language))


_CODES = frozenset("ldjFYHi")


def _parse(fmt: str) -> tuple[tuple[str, str], ...]:
    """Split a Django date format (only _CODES, ``\\`` quoting) into (code, "") and ("", literal)."""
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
    fields = {
        "l": words.weekdays[local.weekday()],
        "d": f"{local.day:02d}",
        "j": words.days[local.day - 1],
        "F": words.months[local.month - 1],
        "Y": str(local.year),
        "H": f"{local.hour:02d}",
        "i": f"{local.minute:02d}",
    }
    return "".join(fields[code] if code else literal for code, literal in parts)


def _when(local: datetime, words: _Words) -> str:
    return f"{_format(local, words.start_format, words)} {local.tzname()}"


def _until(local_end: datetime, local_begin: datetime, words: _Words) -> str:
    if local_end.date() != local_begin.date():
        return _when(local_end, words)
    return f"{_format(local_end, words.end_format, words)} {local_end.tzname()}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _join_url(value: str) -> str:
    """Return the join link when it is an https link on one line (the model's rule), else ''."""
    if value.lower().startswith("https://") and value.isprintable() and " " not in value:
        return value
    return ""


# Where a long line may break: whitespace, but not a no-break space (U+00A0, U+2007, U+202F),
# which holds "10 km" together and keeps French "!" and ":" off the start of a line.
_BREAK = re.compile(r"[^\S\u00a0\u2007\u202f]+")
_KEEP_TOGETHER = ("\u00a0", "\u2007", "\u202f")  # without one, str.split is the same, faster


def wrap_text(text: str) -> str:
    """Wrap each line at TEXT_WIDTH, never inside a word: a long link keeps a line of its own."""
    wrapped = []
    for line in text.splitlines():
        if len(line) <= TEXT_WIDTH:
            wrapped.append(line)
            continue
        # Greedy, word by word: textwrap is too slow per reminder.
        current = ""
        kept = any(space in line for space in _KEEP_TOGETHER)
        words = _BREAK.split(line) if kept else line.split()
        for word in filter(None, words):
            if not current:
                current = word
            elif len(current) + 1 + len(word) <= TEXT_WIDTH:
                current += " " + word
            else:
                wrapped.append(current)
                current = word
        wrapped.append(current)  # '' for a line of spaces only: it stays a line
    return "\n".join(wrapped) + ("\n" if text.endswith("\n") else "")


def _values(*, attendee, workshop, facts, zone: ZoneInfo, words: _Words) -> dict[str, str]:
    """Return the placeholders' values; ``facts`` is the workshop or a revision of it."""
    start, end = facts.starts_at.astimezone(zone), facts.ends_at.astimezone(zone)
    return {
        "attendee_name": attendee.name,
        "workshop_title": workshop.title,
        "start_local": _when(start, words),
        "end_local": _until(end, start, words),
        "zone": zone.key,
        "location": _one_line(facts.location),
        "join_url": _join_url(facts.join_url),
        "organiser": _one_line(workshop.contact_name),
        "organiser_email": workshop.contact_email,
    }


def _fact_lines(values: dict[str, str], label: dict, elsewhere: str = "") -> list[str]:
    """Return the plain text lines of when, until, where and the join link."""
    lines = [
        f"{label['when']} {values['start_local']} ({values['zone']}){elsewhere}",
        f"{label['until']} {values['end_local']}",
    ]
    if values["location"]:
        lines.append(f"{label['where']} {values['location']}")
    if values["join_url"]:
        lines.append(f"{label['join']} {values['join_url']}")
    return lines


# Django's escape without its lazy wrapper (every value here is a str already).
_escape = html.escape


def _bdi(value: str) -> str:
    """Escape and isolate a value, so a right-to-left name cannot reorder its line."""
    return f"<bdi>{_escape(value)}</bdi>"


def _link(url: str) -> str:
    url = _escape(url)
    return f'<a href="{url}" style="color: #1a5fb4">{url}</a>'


def _html(language: str, title: str, paragraphs: str) -> str:
    """Return a whole HTML part; its title (the subject) is what a screen reader announces."""
    return (
        "<!doctype html>\n"
        f'<html lang="{_escape(language)}">\n'
        f"<head><title>{_escape(title)}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1"></head>\n'
        '<body style="font-family: sans-serif; line-height: 1.5; overflow-wrap: anywhere">\n'
        f"{paragraphs}"
        "</body>\n"
        "</html>\n"
    )


def _organiser_line(values: dict[str, str], *, html: bool) -> str:
    """Return the organiser's name and address, or '' when the workshop names neither."""
    name, email = values["organiser"], values["organiser_email"]
    if html:
        name, email = (_bdi(name) if name else ""), _escape(email)
    if name and email:
        return f"{name} &lt;{email}&gt;" if html else f"{name} <{email}>"
    return name or email


def _text_body(text, values: dict[str, str], words: _Words, *, elsewhere: str) -> str:
    """Return a reminder's plain text part: the filled intro, then the fixed lines."""
    label = words.labels
    lines = [fill(text.intro, values), "", *_fact_lines(values, label, elsewhere)]
    if who := _organiser_line(values, html=False):
        lines.append(f"{label['organiser']} {who} ({label['reply']})")
    lines += ["", label["calendar"]]
    if values["attendance_url"]:
        lines += ["", f"{label['cant_attend']} {values['attendance_url']}"]
    lines += ["", label["goodbye"]]
    return "\n".join(lines) + "\n"


def _html_paragraphs(text, values: dict[str, str], words: _Words, *, elsewhere: str) -> str:
    """Return a reminder's HTML: inline styles only, everything escaped, names in <bdi>."""
    label = words.html_labels
    details = [
        f"<strong>{label['when']}</strong> {_escape(values['start_local'])} "
        f"({_escape(values['zone'])}){_escape(elsewhere)}",
        f"<strong>{label['until']}</strong> {_escape(values['end_local'])}",
    ]
    if values["location"]:
        details.append(f"<strong>{label['where']}</strong> {_bdi(values['location'])}")
    if values["join_url"]:
        details.append(f"<strong>{label['join']}</strong> {_link(values['join_url'])}")
    if who := _organiser_line(values, html=True):
        details.append(f"<strong>{label['organiser']}</strong> {who} ({label['reply']})")
    intro = fill(text.intro, values, literal=_escape, value=_bdi)
    paragraphs = [part for part in re.split(r"\n\s*\n", intro) if part.strip()]
    intro = "\n".join(f"<p>{paragraph.replace(chr(10), '<br>')}</p>" for paragraph in paragraphs)
    attendance = ""
    if values["attendance_url"]:
        attendance = f"<p>{label['cant_attend']} {_link(values['attendance_url'])}</p>\n"
    lines = "<br>\n".join(details)
    return (
        f"{intro}\n"
        f"<p>{lines}</p>\n"
        f"<p>{label['calendar']}</p>\n"
        f"{attendance}"
        f"<p>{label['goodbye']}</p>\n"
    )


def _envelope(
    *, row, workshop, facts, attendee, zone, text, values, html, ics, method, payload, **fields
) -> Envelope:
    """Return the envelope of a reminder or notice ``row``, with what both kinds share."""
    subject = _one_line(fill(text.subject, values))
    return Envelope(
        reminder_id=row.pk,
        key=row.key,
        recipient=attendee.email,
        recipient_name=_one_line(attendee.name),
        subject=subject,
        html_body=_html(text.language, subject, html),
        attachments=(
            Attachment(filename="workshop.ics", content_type="text/calendar", content=ics),
        ),
        calendar_method=method,
        payload=FrozenMap(
            {
                **payload,
                "workshop_id": str(workshop.pk),
                "workshop_title": _one_line(workshop.title),
                "starts_at": facts.starts_at.astimezone(UTC).isoformat(),
                "ends_at": facts.ends_at.astimezone(UTC).isoformat(),
                "workshop_timezone": workshop.timezone,
                "attendee_timezone": zone.key,
                "language": text.language,
                "calendar_method": method,
            }
        ),
        reply_to=workshop.contact_email,
        reply_to_name=_one_line(workshop.contact_name),
        list_id=list_id(),
        **fields,
    )


def _zone(attendee, workshop) -> ZoneInfo:
    return ZoneInfo(attendee.timezone or workshop.timezone)


def reminder_envelope(*, reminder: Reminder, text=None, send_by=None, links=True) -> Envelope:
    """Return the envelope of a reminder whose attendee and workshop are loaded.

    ``send_by`` is not content: the same rows always give byte-identical content. With
    ``links=False`` it carries none of the attendee's own links (for staff to read: the links
    act for the attendee without a login).
    """
    attendee, workshop = reminder.attendee, reminder.workshop
    # From the workshop's start, as the claim judges it: no row stores a copy.
    deadline = ReminderPolicy.from_settings().deadline_at(workshop.starts_at)
    text = text or reminder.text or choose_text(workshop=workshop, attendee=attendee)
    words = _words(text.language)
    zone = _zone(attendee, workshop)
    values = _values(attendee=attendee, workshop=workshop, facts=workshop, zone=zone, words=words)
    # Not a placeholder: the line under the calendar's (a preview may have no row).
    links = links and bool(reminder.pk)
    values["attendance_url"] = attendance_url(reminder.pk) if links else ""
    elsewhere = ""
    if zone.key != workshop.timezone:
        there = workshop.starts_at.astimezone(ZoneInfo(workshop.timezone))
        elsewhere = words.elsewhere % {
            "start_workshop": _when(there, words),
            "workshop_zone": workshop.timezone,
        }
    details = {
        "location": values["location"],
        "join_url": values["join_url"],
        "reply_to": workshop.contact_email,
        "attendance_url": values["attendance_url"],
    }
    return _envelope(
        row=reminder,
        workshop=workshop,
        facts=workshop,
        attendee=attendee,
        zone=zone,
        text=text,
        values=values,
        text_body=wrap_text(_text_body(text, values, words, elsewhere=elsewhere)),
        html=_html_paragraphs(text, values, words, elsewhere=elsewhere),
        ics=event_ics(
            uid=calendar_uid(reminder.key),
            workshop=workshop,
            facts=workshop,
            stamp=reminder.created_at,
            language=text.language,
        ),
        method="PUBLISH",
        payload={
            "reminder_id": str(reminder.pk),
            "deadline_at": deadline.isoformat(),
            **{name: value for name, value in details.items() if value},
        },
        deadline_at=deadline,
        send_by=send_by,
        unsubscribe_url=unsubscribe_url(reminder.pk) if links else "",
    )


def _notice_body(
    text, values, words: _Words, *, cancelled, attendance, literal=str, value=str, link=str
) -> str:
    """Return a change notice's body: the filled intro, what changed and the facts now.

    ``value`` is applied to each value, ``link`` to the links to follow now and ``literal`` to
    the rest, as fill() does (the HTML part escapes all, isolates values in <bdi>, links them).
    """
    label = {name: literal(said) for name, said in (words.labels | words.notice).items()}
    shown = {name: value(filled) if filled else "" for name, filled in values.items()}
    if values["join_url"]:
        shown["join_url"] = link(values["join_url"])
    lines = [fill(text.intro, values, literal=literal, value=value), ""]
    if cancelled:
        if shown["cancellation_reason"]:
            lines += [f"{label['reason']} {shown['cancellation_reason']}", ""]
    else:
        changes = []
        for name, key in (
            ("when", "start_local"),
            ("until", "end_local"),
            ("where", "location"),
            ("join", "join_url"),
        ):
            if values[key] != values[f"old_{key}"]:
                new, old = shown[key] or label["none"], shown[f"old_{key}"] or label["none"]
                changes.append(f"{label[name]} {new} ({label['was']} {old})")
        if changes:
            lines += [label["changed"], *changes, ""]
        lines += [*_fact_lines(shown, label), ""]
    lines.append(label["remove"] if cancelled else label["update"])
    if attendance:
        lines += ["", f"{label['cant_attend']} {link(attendance)}"]
    return "\n".join(lines)


def notice_envelope(*, notice, text=None, send_by=None) -> Envelope:
    """Return the envelope of a change notice whose attendee, workshop, revision and reminder
    are loaded; its calendar update has the reminder's UID and the revision as SEQUENCE."""
    attendee, workshop, revision = notice.attendee, notice.workshop, notice.revision
    text = (
        text
        or notice.text
        or choose_notice_text(workshop=workshop, attendee=attendee, kind=notice.kind)
    )
    words = _words(text.language)
    zone = _zone(attendee, workshop)
    values = _values(attendee=attendee, workshop=workshop, facts=revision, zone=zone, words=words)
    values |= {
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
    attendance = attendance_url(notice.reminder_id) if notice.pk and not cancelled else ""
    body = _notice_body(text, values, words, cancelled=cancelled, attendance=attendance)
    marked = _notice_body(
        text,
        values,
        words,
        cancelled=cancelled,
        attendance=attendance,
        literal=_escape,
        value=_bdi,
        link=_link,
    )
    method = "CANCEL" if cancelled else "PUBLISH"
    return _envelope(
        row=notice,
        workshop=workshop,
        facts=revision,
        attendee=attendee,
        zone=zone,
        text=text,
        values=values,
        text_body=wrap_text(body + "\n"),
        html="".join(
            f"<p>{part.replace(chr(10), '<br>')}</p>\n"
            for part in marked.split("\n\n")
            if part.strip()
        ),
        ics=event_ics(
            uid=calendar_uid(notice.reminder.key),
            workshop=workshop,
            facts=revision,
            stamp=revision.created_at,
            sequence=notice.number,
            method=method,
            language=text.language,
            attendee=(_one_line(attendee.name), attendee.email) if cancelled else None,
        ),
        method=method,
        payload={
            "notice_id": str(notice.pk),
            "reminder_id": str(notice.reminder_id),
            "kind": notice.kind,
            "revision": str(notice.number),
            **({"attendance_url": attendance} if attendance else {}),
        },
        kind="notice",
        deadline_at=workshop.starts_at,
        send_by=send_by,
        unsubscribe_url=unsubscribe_url(notice.reminder_id) if notice.pk else "",
    )


# Parsed once per value: parseaddr took a fifth of rendering a reminder.
_mailbox = functools.lru_cache(maxsize=8)(parseaddr)


def sender_domain() -> str:
    """Return the domain of DEFAULT_FROM_EMAIL (Message-IDs, DKIM and the List-Id are under it)."""
    return _mailbox(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2] or "localhost"


def list_id() -> str:
    """Return the List-Id every message carries: the sender's domain, under ``reminders.``."""
    return f"Workshop reminders <reminders.{sender_domain()}>"


def calendar_uid(key: str) -> str:
    """Return the calendar UID of the reminder with ``key``: its notices carry the same one."""
    return f"{key_digest(key)}@workshop-reminders"


def event_ics(
    *,
    uid: str,
    workshop,
    facts,
    stamp: datetime,
    language: str,
    sequence: int = 0,
    method: str = "PUBLISH",
    attendee: tuple[str, str] | None = None,
) -> bytes:
    """Return an iCalendar object (RFC 5545) for one message about ``workshop``.

    ``facts`` is the workshop or a revision. An attendee's messages share one ``uid``, each
    notice a higher ``sequence`` (RFC 5546); a CANCEL names ``attendee`` (name, address).
    """
    held_in = _words(language).held_in.replace("{zone}", workshop.timezone)
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
        f"DTSTART:{_ics_time(facts.starts_at)}",
        f"DTEND:{_ics_time(facts.ends_at)}",
        f"SUMMARY:{_ics_text(workshop.title)}",
        f"DESCRIPTION:{_ics_text(held_in)}",
        f"STATUS:{'CANCELLED' if method == 'CANCEL' else 'CONFIRMED'}",
    ]
    if facts.location:
        lines.append(f"LOCATION:{_ics_text(facts.location)}")
    if _join_url(facts.join_url):
        lines.append(f"URL:{facts.join_url}")  # a URI value: printable, one line, no escaping
    name, address = workshop.contact_name, workshop.contact_email
    if _address_problem(address) is not None:
        # RFC 5546 asks for an ORGANIZER in every PUBLISH and CANCEL: the sender then.
        name, address = _mailbox(settings.DEFAULT_FROM_EMAIL)
    lines.append(f"ORGANIZER{_ics_cn(name)}:{_organiser_mailto(address)}")
    if attendee is not None:
        lines.append(f"ATTENDEE{_ics_cn(attendee[0])}:{_mailto(attendee[1])}")
    lines += ["END:VEVENT", "END:VCALENDAR"]
    return ("\r\n".join(_fold(line) for line in lines) + "\r\n").encode()


# Every line break str.splitlines() knows.
_ICS_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Other controls are not allowed in a TEXT value (RFC 5545, 3.1).
_ICS_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")


# An organiser's address is a workshop's, so few and repeated: each is checked once.
_address_problem = functools.lru_cache(maxsize=256)(address_problem)


def _mailto(address: str) -> str:
    """Return ``address`` as a mailto URI (RFC 6068, 2): its local part percent-encoded but
    for the characters a URI may hold there, its domain in IDNA form as the RFC advises."""
    local, _, domain = address.rpartition("@")
    local = quote(local, safe="!$'*+")
    return f"mailto:{local}@{idna_domain(domain) or quote(domain)}"


# An organiser's is written once, as it is checked once; an attendee's is not cached.
_organiser_mailto = functools.lru_cache(maxsize=256)(_mailto)


def _ics_text(value: str) -> str:
    """Escape text for an iCalendar value (RFC 5545, 3.3.11): no value can break its line."""
    value = value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,")
    return _ICS_CONTROLS.sub("", _ICS_BREAKS.sub("\\\\n", value))


def _ics_cn(value: str) -> str:
    """Return a name as a quoted CN parameter (RFC 5545, 3.2): no quotes, one line; '' if blank.

    A caret is doubled (RFC 6868): calendars that read ^n and ^' as escapes read it back as is.
    """
    text = _ICS_CONTROLS.sub("", _ICS_BREAKS.sub(" ", value)).replace('"', "'").strip()
    text = text.replace("^", "^^")
    return f';CN="{text}"' if text else ""


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
    at = moment.astimezone(UTC)
    return f"{at.year:04}{at.month:02}{at.day:02}T{at.hour:02}{at.minute:02}{at.second:02}Z"


@dataclass(frozen=True, slots=True)
class Preview:
    """What an attendee would get: the envelope, its text, and whether that text is frozen."""

    envelope: Envelope
    text: MessageText
    frozen: bool


def _reminder_of(*, workshop, attendee, now: datetime) -> Reminder:
    """Return the attendee's reminder for ``workshop``, else an unsaved one made ``now``."""
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
    return reminder


def reminder_preview(*, workshop, attendee, now: datetime) -> Preview:
    """Return what ``attendee`` would get for ``workshop`` if it were sent at ``now`` (read only),
    without their own links, as a notice's preview (its notice has no row)."""
    reminder = _reminder_of(workshop=workshop, attendee=attendee, now=now)
    frozen = reminder.text_id is not None
    text = reminder.text if frozen else choose_text(workshop=workshop, attendee=attendee)
    return Preview(
        envelope=reminder_envelope(reminder=reminder, text=text, links=False),
        text=text,
        frozen=frozen,
    )


def notice_preview(*, workshop, attendee, now: datetime) -> Preview:
    """Return the change notice ``attendee`` would get for ``workshop`` at ``now`` (read only).

    "From" is what they were last told, else the workshop as it is (nothing marked changed).
    """
    reminder = _reminder_of(workshop=workshop, attendee=attendee, now=now)
    enrolled = workshop.enrollments.filter(attendee=attendee, status="active").exists()
    told = reminder.told_starts_at is not None
    if workshop.status == "cancelled" or not enrolled:
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
