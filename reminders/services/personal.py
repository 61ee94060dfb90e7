"""Remove an attendee's address and name from texts staff can read (provider errors, reasons).

Used by the erasure, and by the record of a worker that claimed a reminder
before the erasure: a provider's error often echoes the old address.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.db import connection

from workshops.models import Attendee

ERASED_TEXT = "[erased]"
# Names shorter than this are not searched for in texts: they match ordinary words.
MIN_NAME_TO_SCRUB = 4


def personal_words(*, email: str, name: str) -> list[str]:
    """Return the texts to remove: the email, and the full name unless it is too short."""
    words = [email] if email else []
    name = name.strip()
    if len(name) >= MIN_NAME_TO_SCRUB:
        words.append(name)
    return words


def scrubber(words: list[str]):
    """Return a function replacing every word (case-insensitive) by ``ERASED_TEXT``."""
    if not words:
        return lambda text: text
    pattern = re.compile("|".join(map(re.escape, words)), flags=re.IGNORECASE)
    return lambda text: pattern.sub(ERASED_TEXT, text) if text else text


def erased_among(attendee_ids: Iterable[int]) -> set[int]:
    """Return which of ``attendee_ids`` are erased, holding their rows until the transaction ends.

    The erasure's ``FOR UPDATE`` waits for this ``FOR KEY SHARE``: either it
    committed first (the caller scrubs) or it scrubs the caller's text after.
    Call it inside ``atomic``, before any reminder row is locked.
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
