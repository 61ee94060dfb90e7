"""Remove an attendee's address and name from texts staff can read (provider errors, reasons).

Shared by the erasure (reminders.services.erasure), which scrubs what is already
stored, and the record (reminders.services.record), which scrubs what a
worker that claimed a reminder before the erasure would write after it: the
claim loaded the attendee's old address, and a provider's error often echoes
it ("550 5.1.1 <ada@example.org>: mailbox unavailable").
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

    On PostgreSQL the rows are locked ``FOR KEY SHARE``, which the erasure's
    ``FOR UPDATE`` waits for: either the erasure committed before this read
    (and the caller scrubs what it writes), or it starts after the caller
    commits and scrubs the caller's text itself. Call it inside ``atomic``,
    before any reminder row is locked (lock order: attendee, workshop,
    enrollment, reminder, attempt).
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
