"""The sent marker: the database refuses a second reminder for the same (attendee, workshop)."""

import pytest
from django.db import IntegrityError, connection, transaction

from reminders.models import Reminder, reminder_key

pytestmark = pytest.mark.django_db


def test_second_reminder_for_the_same_pair_is_an_integrity_error(make_workshop, enrol):
    assert connection.vendor == "postgresql"
    (enrollment,) = enrol(make_workshop())
    existing = Reminder.objects.get()  # planned when the enrollment was made
    with pytest.raises(IntegrityError) as caught, transaction.atomic():
        # Another key cannot get around the pair constraint.
        Reminder.objects.create(
            attendee=enrollment.attendee,
            workshop=enrollment.workshop,
            enrollment=enrollment,
            key="another-key",
            window_opens_at=existing.window_opens_at,
            deadline_at=existing.deadline_at,
        )
    assert "reminder_unique_attendee_workshop" in str(caught.value)
    assert Reminder.objects.count() == 1


def test_sending_without_a_lease_is_refused_by_the_database(make_workshop, enrol):
    enrol(make_workshop())
    with pytest.raises(IntegrityError, match="reminder_sending_has_lease"), transaction.atomic():
        Reminder.objects.update(status="sending")


def test_key_is_stable_and_derived_from_the_pair():
    assert reminder_key(attendee_id=7, workshop_id=3, prefix="rem") == "rem-w3-a7"
    assert reminder_key(attendee_id=7, workshop_id=3) == "rem-w3-a7"
