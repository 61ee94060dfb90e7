"""The sent marker: the database refuses a second reminder for the same (attendee, workshop)."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from reminders.models import Reminder, reminder_key

pytestmark = pytest.mark.django_db


def test_second_reminder_for_the_same_pair_is_an_integrity_error(make_workshop, enrol):
    assert connection.vendor == "postgresql"
    (enrollment,) = enrol(make_workshop())
    assert Reminder.objects.count() == 1  # planned when the enrollment was made
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        # Another key cannot get around the pair constraint.
        Reminder.objects.create(
            attendee=enrollment.attendee,
            workshop=enrollment.workshop,
            enrollment=enrollment,
            key="another-key",
        )
    assert "reminder_unique_attendee_workshop" in str(caught.value)
    assert Reminder.objects.count() == 1


def test_sending_without_a_lease_is_refused_by_the_database(make_workshop, enrol):
    enrol(make_workshop())
    with (
        pytest.raises(IntegrityError, match="reminder_claimed_while_sending"),
        transaction.atomic(),
    ):
        Reminder.objects.update(status="sending")


def test_a_claim_token_outside_sending_is_refused_by_the_database(make_workshop, enrol):
    enrol(make_workshop())
    with (
        pytest.raises(IntegrityError, match="reminder_claimed_while_sending"),
        transaction.atomic(),
    ):
        Reminder.objects.update(claim_token=uuid.uuid4())


def test_key_is_stable_and_derived_from_the_pair(settings):
    assert reminder_key(attendee_id=7, workshop_id=3) == "rem-w3-a7"
    settings.REMINDERS_KEY_PREFIX = "other"
    assert reminder_key(attendee_id=7, workshop_id=3) == "other-w3-a7"


def test_the_maybe_sent_backfill_marks_unknown_rows_and_rows_with_an_unanswered_call(
    clock, due_reminders
):
    """Migration 0015: rows already ``unknown``, and rows whose attempts include a call with
    no definite answer (timed out, stopped mid-call, lease lost), get ``maybe_sent``; a row
    whose calls all got an answer does not."""
    import importlib

    from django.apps import apps

    from reminders.models import DeliveryAttempt

    backfill = importlib.import_module("reminders.migrations.0015_reminder_maybe_sent").backfill
    ids = due_reminders(6)
    outcomes = ["timed_out", "cancelled", "lease_expired", "transient", "permanent"]
    for pk, outcome in zip(ids, outcomes, strict=False):
        DeliveryAttempt.objects.create(
            reminder_id=pk, number=1, claim_token=uuid.uuid4(), channel="http",
            claimed_at=clock.now(), lease_expires_at=clock.now(), outcome=outcome,
        )  # fmt: skip
    Reminder.objects.filter(pk=ids[5]).update(status="unknown")
    Reminder.objects.update(maybe_sent=False)
    backfill(apps, None)
    marked = dict(Reminder.objects.values_list("pk", "maybe_sent"))
    assert [marked[pk] for pk in ids] == [True, True, True, False, False, True]


def test_every_foreign_key_leads_an_index():
    """A key without an index of its own is covered by one that leads with it (0029), so a
    lookup or a PROTECT/CASCADE check by that column never reads a whole table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.conrelid::regclass::text, a.attname
            FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
            WHERE c.contype = 'f' AND array_length(c.conkey, 1) = 1
              AND c.conrelid::regclass::text ~ '^(reminders|workshops)_'
              AND NOT EXISTS (
                SELECT 1 FROM pg_index i
                WHERE i.indrelid = c.conrelid AND i.indkey[0] = c.conkey[1] AND i.indpred IS NULL
              )
            ORDER BY 1, 2
            """
        )
        unindexed = cursor.fetchall()
    assert unindexed == []
