"""The claim's hand-written SQL: its read of the claimed rows (reminders.services._sql.
RowsWithRelated) builds what the ORM's select_related builds, value for value, and the
lock of a claim's rows (reminders.services.fate.claimed_locked) refuses to run unlocked."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from reminders.models import Reminder
from reminders.services import reminder_claim_batch, reminder_release
from reminders.services._sql import RowsWithRelated

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
            order="r.deadline_at, r.id",
            params=ids,
        )


def test_rows_with_related_equal_the_orms_select_related(
    clock, make_workshop, enrol, django_assert_num_queries
):
    workshop = make_workshop(starts_in=timedelta(hours=2), location="Room 4 — Café")
    later = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=2)
    enrol(later)
    ids = list(Reminder.objects.order_by("id").values_list("id", flat=True))
    # One reminder has a frozen text (claimed once, then handed back), the others none.
    claim = reminder_claim_batch(ids=ids[:1], channel="http", clock=clock)
    reminder_release(claim=claim, clock=clock)

    with django_assert_num_queries(1):
        read = _read(ids)
        # Everything select_related would have loaded is loaded: no query per relation.
        loaded = [(r.attendee.email, r.workshop.title, r.text and r.text.digest) for r in read]
    orm = list(
        Reminder.objects.filter(pk__in=ids).select_related(*RELATED).order_by("deadline_at", "id")
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
