"""Remove an attendee's address and name from texts staff can read (provider errors, reasons).

Used by the erasure, and by the record of a reminder claimed before it (errors echo addresses).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from django.db import connection

from delivery.addresses import idna_domain
from workshops.models import Attendee

ERASED_TEXT = "[erased]"
# Shorter name parts are scrubbed only from texts about the attendee, not from every staff
# decision's reason, where "Bo" or "An" would hit ordinary words in other people's notes.
MIN_NAME_TO_SCRUB = 4
_NAME_PARTS = re.compile(r"[^\W\d_](?:[\w'’.-]*\w)?")


def personal_words(*, email: str, name: str, short_names: bool = True) -> list[str]:
    """Return every form of the attendee's address and name that was sent or echoed.

    The address as typed and with a punycode domain (as sent and quoted back); the full name
    and each part ("Dear Zoë"), parts under ``MIN_NAME_TO_SCRUB`` only with ``short_names``.
    """
    words: list[str] = []
    if email:
        words.append(email)
        local, _, domain = email.rpartition("@")
        wire = idna_domain(domain)
        if local and wire and wire != domain.lower():
            words.append(f"{local}@{wire}")
    name = name.strip()
    least = 2 if short_names else MIN_NAME_TO_SCRUB
    if len(name) >= least:
        words.append(name)
    words += [part for part in _NAME_PARTS.findall(name) if len(part) >= least]
    return list(dict.fromkeys(words))


def scrubber(words: list[str]):
    """Return a function replacing every word (case-insensitive) by ``ERASED_TEXT``.

    An address is replaced wherever it occurs; a name or part of one only as a whole
    word ("Ann" in "Ann's", not in "Annual").
    """
    if not words:
        return lambda text: text
    alternatives = [
        re.escape(word) if "@" in word else rf"(?<!\w){re.escape(word)}(?!\w)"
        for word in sorted(words, key=len, reverse=True)  # the full name before its parts
    ]
    pattern = re.compile("|".join(alternatives), flags=re.IGNORECASE)
    return lambda text: pattern.sub(ERASED_TEXT, text) if text else text


def scrub_cut_end(text: str, words: list[str]) -> str:
    """Return ``text`` with its end replaced by ``ERASED_TEXT`` if it begins one of ``words``:
    a text cut to its column's length may end inside a name or address ("Ada Lovel"), which
    ``scrubber`` does not recognise. Scrub it before the rest (run it on the text as written)."""
    lowered = [word.lower() for word in words]
    for start in range(max(0, len(text) - max(map(len, words), default=0)), len(text) - 1):
        end = text[start:].lower()
        if not _WORD_CHAR.match(text, start) or (start and _WORD_CHAR.match(text, start - 1)):
            continue
        if any(word.startswith(end) for word in lowered):
            return text[:start] + ERASED_TEXT
    return text


_WORD_CHAR = re.compile(r"\w")


def scrub_json_text(text: str, scrub) -> str:
    """Scrub the strings inside a JSON document (Django's admin log change messages store
    non-ASCII escaped, where a plain text search misses it); other text as it is."""
    try:
        document = json.loads(text)
    except ValueError:
        return scrub(text)
    return json.dumps(_map_strings(document, scrub))


def json_strings(text: str) -> list[str]:
    """Return the strings inside a JSON document, or ``[text]`` if it is none."""
    try:
        document = json.loads(text)
    except ValueError:
        return [text]
    found: list[str] = []
    _map_strings(document, lambda value: found.append(value) or value)
    return found


def _map_strings(value, function):
    if isinstance(value, str):
        return function(value)
    if isinstance(value, list):
        return [_map_strings(item, function) for item in value]
    if isinstance(value, dict):
        return {key: _map_strings(item, function) for key, item in value.items()}
    return value


def erased_among(attendee_ids: Iterable[int]) -> set[int]:
    """Return which of ``attendee_ids`` are erased, holding their rows until the transaction ends.

    The erasure's ``FOR UPDATE`` waits for this ``FOR KEY SHARE``: it committed first (the caller
    scrubs) or scrubs the caller's text after. Call in ``atomic``, before any reminder lock.
    """
    ids = sorted(set(attendee_ids))
    if not ids:
        return set()
    if connection.vendor != "postgresql":
        # SQLite (the local run) serialises writers: a plain read is enough.
        return set(
            Attendee.objects.filter(pk__in=ids, erased_at__isnull=False).values_list(
                "pk", flat=True
            )
        )
    table = connection.ops.quote_name(Attendee._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, erased_at IS NOT NULL FROM {table} WHERE id = ANY(%s) "
            "ORDER BY id FOR KEY SHARE",
            [ids],
        )
        return {pk for pk, erased in cursor.fetchall() if erased}
