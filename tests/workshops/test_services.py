"""Workshop, attendee and enrollment services: validation names the field, nothing half-saved."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from workshops.models import Attendee, Enrollment, Workshop
from workshops.services import (
    attendee_get_or_create,
    enrollment_cancel,
    enrollment_create,
    workshop_create,
    workshop_update,
)

pytestmark = pytest.mark.django_db


def test_naive_start_is_rejected_on_starts_at(clock):
    with pytest.raises(ValidationError) as caught:
        workshop_create(
            title="Naive",
            starts_at=datetime(2026, 3, 3, 10, 0),
            duration=timedelta(hours=1),
            timezone="Europe/Berlin",
            clock=clock,
        )
    assert "aware" in caught.value.message_dict["starts_at"][0]
    assert Workshop.objects.count() == 0


def test_unknown_zone_is_rejected_on_timezone(clock):
    with pytest.raises(ValidationError) as caught:
        workshop_create(
            title="Nowhere",
            starts_at=clock.now() + timedelta(hours=2),
            duration=timedelta(hours=1),
            timezone="Mars/Olympus_Mons",
            clock=clock,
        )
    assert caught.value.message_dict["timezone"] == [
        "Mars/Olympus_Mons is not a known time zone; use an IANA name such as Europe/Berlin."
    ]
    assert Workshop.objects.count() == 0


def test_end_before_start_is_rejected_on_ends_at(clock):
    start = clock.now() + timedelta(hours=2)
    with pytest.raises(ValidationError) as caught:
        workshop_create(
            title="Backwards",
            starts_at=start,
            ends_at=start - timedelta(minutes=5),
            timezone="UTC",
            clock=clock,
        )
    assert caught.value.message_dict["ends_at"] == ["The end must be after the start."]


def test_start_in_the_past_is_rejected(clock):
    with pytest.raises(ValidationError) as caught:
        workshop_create(
            title="Yesterday",
            starts_at=clock.now() - timedelta(days=1),
            duration=timedelta(hours=1),
            timezone="UTC",
            clock=clock,
        )
    assert "past" in caught.value.message_dict["starts_at"][0]


def test_invalid_email_is_rejected_on_email():
    with pytest.raises(ValidationError) as caught:
        attendee_get_or_create(email="not-an-address", name="Nobody")
    assert "email" in caught.value.message_dict
    assert Attendee.objects.count() == 0


def test_same_email_in_another_case_is_the_same_attendee():
    """D6: one person enrolled twice with different case is one attendee."""
    first, created_first = attendee_get_or_create(email="Ada@Example.com", name="Ada")
    second, created_second = attendee_get_or_create(email="ada@example.COM", name="Ada L.")
    assert (created_first, created_second) == (True, False)
    assert first.pk == second.pk
    assert Attendee.objects.count() == 1


def test_case_insensitive_email_uniqueness_is_a_database_constraint():
    from django.db import IntegrityError, transaction

    Attendee.objects.create(email="grace@example.com", name="Grace")
    with pytest.raises(IntegrityError), transaction.atomic():
        Attendee.objects.create(email="GRACE@example.com", name="Grace again")


def test_duplicate_enrollment_is_rejected_on_attendee(make_workshop, make_attendee):
    workshop, attendee = make_workshop(), make_attendee()
    enrollment_create(attendee=attendee, workshop=workshop)
    with pytest.raises(ValidationError) as caught:
        enrollment_create(attendee=attendee, workshop=workshop)
    assert caught.value.message_dict["attendee"] == [
        "This attendee is already enrolled in this workshop."
    ]
    assert Enrollment.objects.count() == 1


def test_cancelled_enrollment_is_reactivated_not_duplicated(make_workshop, make_attendee):
    workshop, attendee = make_workshop(), make_attendee()
    enrollment = enrollment_create(attendee=attendee, workshop=workshop)
    enrollment_cancel(enrollment=enrollment)
    again = enrollment_create(attendee=attendee, workshop=workshop)
    assert again.pk == enrollment.pk
    assert again.status == Enrollment.Status.ACTIVE


@pytest.mark.parametrize("changed", ["workshop cancelled", "attendee erased"])
def test_enrolling_judges_the_workshop_and_attendee_as_they_are_now(
    make_workshop, make_attendee, changed
):
    """The caller's copies were read before another request cancelled the workshop or erased
    the attendee (a bulk update, an API call, the admin): the enrolment is still refused."""
    workshop, attendee = make_workshop(), make_attendee()
    if changed == "workshop cancelled":
        Workshop.objects.filter(pk=workshop.pk).update(status=Workshop.Status.CANCELLED)
    else:
        Attendee.objects.filter(pk=attendee.pk).update(erased_at=datetime(2026, 3, 1, tzinfo=UTC))
    with pytest.raises(ValidationError) as caught:
        enrollment_create(attendee=attendee, workshop=workshop)
    assert set(caught.value.message_dict) == {changed.split()[0]}
    assert not Enrollment.objects.exists()


def test_update_refuses_status_changes(make_workshop):
    with pytest.raises(TypeError, match="workshop_cancel"):
        workshop_update(workshop=make_workshop(), status="cancelled")


def test_invalid_update_leaves_the_row_unchanged(make_workshop):
    workshop = make_workshop()
    with pytest.raises(ValidationError):
        workshop_update(workshop=workshop, timezone="Not/AZone")
    workshop.refresh_from_db()
    assert workshop.timezone == "Europe/Berlin"


def test_cancelling_stamps_updated_at_with_the_clock(clock, make_workshop, enrol):
    """A cancel is a set-based UPDATE (auto_now does not run): it stamps the time itself."""
    from workshops.services import enrollment_cancel, workshop_cancel

    workshop = make_workshop()
    (enrollment,) = enrol(workshop)
    clock.advance(3600)
    assert enrollment_cancel(enrollment=enrollment).updated_at == clock.now()
    clock.advance(60)
    assert workshop_cancel(workshop=workshop).updated_at == clock.now()


def test_the_details_a_reminder_shows_are_validated_by_the_model(clock):
    start = clock.now() + timedelta(days=2)
    with pytest.raises(ValidationError) as caught:
        workshop_create(
            title="Kiln",
            starts_at=start,
            duration=timedelta(hours=1),
            timezone="Europe/Berlin",
            join_url="http://meet.example.org/x",
            contact_email="not an address",
        )
    assert set(caught.value.message_dict) == {"join_url", "contact_email"}
    assert not Workshop.objects.exists()
    with pytest.raises(TypeError, match="unknown fields"):
        workshop_create(title="Kiln", starts_at=start, timezone="Europe/Berlin", room="4")


def test_an_unsaved_workshop_holds_empty_details_not_a_database_expression():
    """With db_default alone, an unsaved workshop would hold an expression, and rendering a
    message from it (a preview built in memory, a benchmark's rows) would fail."""
    workshop = Workshop(title="Kiln")
    details = [workshop.location, workshop.join_url, workshop.contact_name, workshop.contact_email]
    assert details == ["", "", "", ""]
