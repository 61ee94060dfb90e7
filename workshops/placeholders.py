"""The placeholders staff may write in a reminder's subject and intro, and how they are filled.

A placeholder is a name in braces, ``{attendee_name}``; ``{{`` and ``}}``
stand for literal braces. Filling is plain substitution of text for text:
there is no template language, no attribute access and no filter, so a text
written by staff can never reach an object or a setting. The model validates
every text with ``validate_reminder_text`` (so the admin, the shell and any
future API refuse the same text), and ``fill`` never raises: text that was
valid when it was saved stays renderable.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Mapping

from django.core.exceptions import ValidationError

# Name -> what it becomes (the admin shows this list next to the fields).
PLACEHOLDERS: dict[str, str] = {
    "attendee_name": "the attendee's name",
    "workshop_title": "the workshop's title",
    "start_local": "the start in the attendee's zone, with the zone's abbreviation",
    "end_local": "the end in the attendee's zone, with the zone's abbreviation",
    "zone": "the attendee's time zone, e.g. Europe/Berlin",
    "location": "where it is held",
    "join_url": "the join link",
    "organiser": "the organiser's name",
    "organiser_email": "the organiser's email",
}

# What a change notice's intro may use besides: what the attendee had been told before.
NOTICE_PLACEHOLDERS: dict[str, str] = {
    **PLACEHOLDERS,
    "old_start_local": "the start the attendee had been told, in their zone",
    "old_end_local": "the end the attendee had been told, in their zone",
    "old_location": "the place the attendee had been told",
    "old_join_url": "the join link the attendee had been told",
    "cancellation_reason": "the reason staff gave for cancelling (blank otherwise)",
}

# "{{" and "}}" (literal braces), a braced name, or a lone brace.
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}\n]*)\}|[{}]")


def valid_list(names: Mapping[str, str] = PLACEHOLDERS) -> str:
    return ", ".join(f"{{{name}}}" for name in names)


def text_problems(text: str, names: Mapping[str, str] = PLACEHOLDERS) -> list[str]:
    """Return one message per mistake in ``text``: unknown placeholders and lone braces."""
    problems: list[str] = []
    for match in _TOKEN.finditer(text):
        token, name = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            continue
        if name is None:
            problems.append(
                f"A lone {token!r} at character {match.start() + 1}: write {token * 2} "
                f"for a literal brace, or a placeholder such as {{attendee_name}}."
            )
        elif name not in names:
            close = difflib.get_close_matches(name.strip(), list(names), n=1)
            hint = f" Did you mean {{{close[0]}}}?" if close else ""
            problems.append(f"Unknown placeholder {token}.{hint}")
    return problems


# The longest subject or intro staff may write: a few screens of mail.
MAX_TEXT_LENGTH = 5_000


def validate_reminder_text(value: str, names: Mapping[str, str] = PLACEHOLDERS) -> None:
    """Refuse a subject or intro that is too long, or has an unknown placeholder or a lone
    brace, naming each."""
    if len(value or "") > MAX_TEXT_LENGTH:
        raise ValidationError(
            "This text has %(length)s characters; a reminder text may have at most "
            "%(limit)s characters. Shorten it.",
            code="too_long",
            params={"length": f"{len(value):,}", "limit": f"{MAX_TEXT_LENGTH:,}"},
        )
    problems = text_problems(value or "", names)
    if problems:
        raise ValidationError(
            "%(problems)s Valid placeholders: %(valid)s.",
            code="unknown_placeholder",
            params={"problems": " ".join(problems), "valid": valid_list(names)},
        )


def validate_notice_text(value: str) -> None:
    """Refuse a change notice's intro as validate_reminder_text does, with its own placeholders."""
    validate_reminder_text(value, NOTICE_PLACEHOLDERS)


@functools.lru_cache(maxsize=1024)
def _parts(text: str) -> tuple[tuple[str, str], ...]:
    """Split ``text`` into (name, token) placeholders and ("", text) literals, once per text
    (a workshop's thousand reminders share theirs)."""
    parts: list[tuple[str, str]] = []

    def add_literal(piece: str) -> None:
        if not piece:
            return
        if parts and not parts[-1][0]:
            parts[-1] = ("", parts[-1][1] + piece)
        else:
            parts.append(("", piece))

    position = 0
    for match in _TOKEN.finditer(text):
        add_literal(text[position : match.start()])
        token, name = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            add_literal(token[0])
        elif name in NOTICE_PLACEHOLDERS:
            parts.append((name, token))
        else:
            add_literal(token)
        position = match.end()
    add_literal(text[position:])
    return tuple(parts)


def fill(
    text: str,
    values: Mapping[str, str],
    *,
    literal: Callable[[str], str] = str,
    value: Callable[[str], str] = str,
) -> str:
    """Return ``text`` with each placeholder replaced by its value.

    ``literal`` is applied to the staff's own text between placeholders and
    ``value`` to each filled value (the HTML part escapes both, and isolates
    values with ``<bdi>``). Anything that is not a known placeholder, or has
    no value in ``values``, is kept as written; an empty value fills nothing.
    """
    out: list[str] = []
    for name, piece in _parts(text):
        if not name or name not in values:
            out.append(literal(piece))
        elif values[name]:
            out.append(value(values[name]))
    return "".join(out)
