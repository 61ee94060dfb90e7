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

# "{{" and "}}" (literal braces), a braced name, or a lone brace.
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}\n]*)\}|[{}]")


def valid_list() -> str:
    return ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)


def text_problems(text: str) -> list[str]:
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
        elif name not in PLACEHOLDERS:
            close = difflib.get_close_matches(name.strip(), PLACEHOLDERS, n=1)
            hint = f" Did you mean {{{close[0]}}}?" if close else ""
            problems.append(f"Unknown placeholder {token}.{hint}")
    return problems


def validate_reminder_text(value: str) -> None:
    """Refuse a subject or intro with an unknown placeholder or a lone brace, naming each."""
    problems = text_problems(value or "")
    if problems:
        raise ValidationError(
            "%(problems)s Valid placeholders: %(valid)s.",
            code="unknown_placeholder",
            params={"problems": " ".join(problems), "valid": valid_list()},
        )


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
    values with ``<bdi>``). Anything that is not a known placeholder is kept
    as written.
    """
    out: list[str] = []
    position = 0
    for match in _TOKEN.finditer(text):
        out.append(literal(text[position : match.start()]))
        token, name = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            out.append(literal(token[0]))
        elif name in values:
            out.append(value(values[name]) if values[name] else "")
        else:
            out.append(literal(token))
        position = match.end()
    out.append(literal(text[position:]))
    return "".join(out)
