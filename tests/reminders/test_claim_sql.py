"""The claim's hand-written SQL: its read of the claimed rows (reminders.services._sql.
RowsWithRelated) builds what the ORM's select_related builds, value for value; the lock
of a claim's rows (reminders.services.fate.claimed_locked) refuses to run unlocked; and on
PostgreSQL a chunk's lists and rows of values go as arrays, so its statements read the
same whatever its size, and every value arrives as given."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from delivery.results import DeliveryResult, Outcome
from reminders.models import Reminder
from reminders.services import reminder_claim_batch, reminder_record_batch, reminder_release
from reminders.services._sql import RowsWithRelated, array_literal, one_of, rows_cte
from reminders.services.feedback import suppression_addresses
from reminders.services.watch import ClaimWatch

pytestmark = pytest.mark.django_db

RELATED = ("attendee", "workshop", "text")


def _values(instance) -> dict:
    return {field.attname: getattr(instance, field.attname) for field in instance._meta.fields}


def _read(ids: list[int]) -> list[Reminder]:
    reader = RowsWithRelated(Reminder, RELATED)
    with connection.cursor() as cursor:
        return reader.read(
            cursor,
            where=f"r.id IN ({', '.join(['%s'] * len(ids))})",
            order="j1.starts_at, r.id",
            params=ids,
        )


def test_rows_with_related_equal_the_orms_select_related(clock, make_workshop, enrol):
    workshop = make_workshop(starts_in=timedelta(hours=2), location="Room 4 — Café")
    later = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    enrol(later)
    ids = list(Reminder.objects.order_by("id").values_list("id", flat=True))
    # One reminder has a frozen text (claimed once, then handed back), the others none.
    claim = reminder_claim_batch(ids=ids[:1], channel="http", clock=clock)
    reminder_release(claim=claim, clock=clock)

    def read_and_touch(ids):
        with CaptureQueriesContext(connection) as queries:
            read = _read(ids)
            # Everything select_related would have loaded is loaded: no query per relation.
            touched = [(r.attendee.email, r.workshop.title, r.text and r.text.digest) for r in read]
        return read, touched, len(queries)

    enrol(make_workshop(starts_in=timedelta(hours=4)), count=27)
    *_, statements_for_30 = read_and_touch(list(Reminder.objects.values_list("id", flat=True)))
    read, loaded, statements_for_3 = read_and_touch(ids)
    assert statements_for_3 == statements_for_30
    orm = list(
        Reminder.objects.filter(pk__in=ids)
        .select_related(*RELATED)
        .order_by("workshop__starts_at", "id")
    )
    assert [r.pk for r in read] == [r.pk for r in orm]
    assert [r.text_id is not None for r in read] == [True, False, False]
    assert all(text is None for *_, text in loaded[1:])
    for ours, theirs in zip(read, orm, strict=True):
        assert _values(ours) == _values(theirs)
        for name in RELATED:
            mine, expected = getattr(ours, name), getattr(theirs, name)
            assert (mine and _values(mine)) == (expected and _values(expected)), name
        assert ours._state.adding is False and ours._state.db == theirs._state.db
        assert ours.deadline_at.tzinfo is not None
        # The same zone object too, not only the same instant (psycopg's loader, not Django's).
        for field in ours._meta.fields:
            if isinstance(getattr(theirs, field.attname), datetime):
                assert getattr(ours, field.attname).tzinfo is getattr(theirs, field.attname).tzinfo


def test_the_claimed_rows_timestamps_are_read_by_psycopgs_compiled_loader():
    if connection.vendor != "postgresql":
        pytest.skip("the loader is psycopg's")
    from psycopg.pq import Format

    reader = RowsWithRelated(Reminder, RELATED)
    with connection.cursor() as cursor:
        reader.read(cursor, where="r.id = %s", order="r.id", params=[0])
        raw = cursor.cursor
        loader = raw.adapters.get_loader(raw.adapters.types["timestamptz"].oid, Format.TEXT)
    # Not Django's loader (a Python class in django.db), nor psycopg's own in Python.
    assert loader.__module__.startswith(("psycopg_binary", "psycopg_c")), loader


@pytest.mark.django_db(transaction=True)  # no test-wide transaction around it
def test_the_lock_of_a_claims_rows_refuses_to_run_outside_a_transaction():
    import uuid

    from django.db import transaction
    from django.db.transaction import TransactionManagementError

    from reminders.services.fate import claimed_locked

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers: the lock sends nothing there")
    with pytest.raises(TransactionManagementError, match="inside atomic"):
        claimed_locked([1], uuid.uuid4())
    with transaction.atomic():
        claimed_locked([1], uuid.uuid4())  # no such row: locks nothing, and that is fine


def _statements(run) -> list[str]:
    """Return the text of every statement ``run()`` sends (parameters and savepoint names
    left out)."""
    sent = []

    def capture(execute, sql, params, many, context):
        sent.append(re.sub(r'"s\d+_x\d+"', '"savepoint"', sql))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        run()
    return sent


def test_a_chunks_statements_read_the_same_whatever_its_size(clock, make_workshop, enrol):
    """Claim (refusing ids another claim holds, freezing texts, reading the suppressions of the
    addresses its batch read first), claim watch and record of a
    chunk of 2 reminders of one workshop, and of 7 of two workshops in two languages: every
    list in them differs in size between the two (ids, held ids, texts, workshops, rows)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no arrays: its lists are IN (...) and VALUES")
    one = make_workshop(starts_in=timedelta(hours=2))
    two = [make_workshop(starts_in=timedelta(hours=3)),
           make_workshop(starts_in=timedelta(hours=4), language="de")]  # fmt: skip
    held_in = [make_workshop(starts_in=timedelta(hours=5)),
               make_workshop(starts_in=timedelta(hours=6), language="de")]  # fmt: skip
    enrol(one, count=2)
    enrol(two[0], count=3)
    enrol(two[1], count=4)
    for workshop in held_in:
        enrol(workshop)
    # Another claim holds one reminder in each language: both texts are stored already,
    # so both chunks find theirs, and each chunk has ids it cannot take (1, then 2).
    held = reminder_claim_batch(
        ids=list(Reminder.objects.filter(workshop__in=held_in).values_list("id", flat=True)),
        channel="http",
    )
    assert len(held.ids) == 2

    def deliver(ids, refused, addresses):
        claim = reminder_claim_batch(
            ids=[*ids, *refused], channel="http", clock=clock, addresses=addresses
        )
        assert sorted(claim.ids) == sorted(ids)
        ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock).refresh()
        results = [
            DeliveryResult(
                reminder_id=reminder.pk,
                key=reminder.key,
                outcome=Outcome.SENT if index % 2 else Outcome.PERMANENT,
                message_id=f"m-{reminder.pk}" if index % 2 else None,
                error="" if index % 2 else "550 it's {not, here}",
                attempts=1,
                provider_reached=True,
                maybe_delivered=bool(index % 2),
            )
            for index, reminder in enumerate(claim.reminders)
        ]
        reminder_record_batch(claim=claim, results=results, clock=clock)
        return claim

    chunks = [
        (list(one.reminders.values_list("id", flat=True)), held.ids[:1]),
        (list(Reminder.objects.filter(workshop__in=two).values_list("id", flat=True)), held.ids),
    ]
    sent, claims = [], []
    for ids, refused in chunks:
        addresses = suppression_addresses([*ids, *refused])  # once a batch, not per chunk
        sent.append(
            _statements(
                lambda ids=ids, refused=refused, addresses=addresses: claims.append(
                    deliver(ids, refused, addresses)
                )
            )
        )
    two_sent, seven_sent = sent
    assert len(two_sent) >= 7, two_sent
    assert two_sent == seven_sent
    assert [len({r.text_id for r in c.reminders}) for c in claims] == [1, 2]
    assert [len({r.workshop_id for r in c.reminders}) for c in claims] == [1, 2]
    assert set(Reminder.objects.exclude(workshop__in=held_in).values_list("status", flat=True)) == {
        "sent",
        "failed",
    }


AWKWARD = [
    'it\'s "quoted"',
    "{braces}, commas, (parens)",
    "back\\slash",
    "",
    "NULL",
    "Café — ✓ 日本",
    " padded ",
]


def test_rows_of_values_arrive_as_given():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's VALUES lists are run by test_record_sqlite.py")
    zone = timezone(timedelta(hours=5, minutes=30))
    rows = [
        (index + 1, text, datetime(2026, 12, 1, 9, index, tzinfo=zone), index - 3)
        for index, text in enumerate(AWKWARD)
    ]
    # NULL in every kind of column, and a bigint past 32 bits.
    rows.append((2**40, None, None, None))
    columns = {"id": "bigint", "word": "text", "at": "timestamptz", "n": "integer"}
    cte, params = rows_cte(connection, "v", columns, rows)
    among, among_params = one_of(connection, "word", AWKWARD[:3] + AWKWARD[4:], kind="text")
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {cte} SELECT id, word, at, n FROM v ORDER BY id", params)
        back = cursor.fetchall()
        cursor.execute(
            f"WITH {cte} SELECT id FROM v WHERE {among} ORDER BY id", params + among_params
        )
        chosen = [row[0] for row in cursor.fetchall()]
        ids, ids_params = one_of(connection, "id", [2, 5, 99])
        cursor.execute(f"WITH {cte} SELECT id FROM v WHERE {ids} ORDER BY id", params + ids_params)
        by_id = [row[0] for row in cursor.fetchall()]
    assert [tuple(row) for row in back] == rows
    assert chosen == [1, 2, 3, 5, 6, 7]
    assert by_id == [2, 5]


def test_an_array_literal_reads_back_as_the_values_it_was_written_from():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no arrays")
    at = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-3)))
    cases = {
        "text": [*AWKWARD, None, "tab\there", "\\", '"', 'x"y\\z'],
        "bigint": [0, -1, 2**62, None],
        "integer": [7, None, -(2**31)],
        "timestamptz": [at, None],
    }
    with connection.cursor() as cursor:
        for kind, values in cases.items():
            cursor.execute(f"SELECT %s::{kind}[]", [array_literal(values, kind)])
            assert cursor.fetchone()[0] == values, kind
