"""An integration changes an attendee's details only if the attendee is its own: it created
them through the API and no other integration knows them. Anyone else's attendee it may
enrol and give its own id, not redirect or rename."""

from __future__ import annotations

from datetime import timedelta

import pytest

from intake.models import AttendeeRef
from tests.intake.test_api import assert_problem, counts
from workshops.models import Attendee, Enrollment
from workshops.services import enrollment_create

pytestmark = pytest.mark.django_db


def details(pk: int) -> tuple[str, ...]:
    return Attendee.objects.values_list("email", "name", "language", "timezone").get(pk=pk)


def refused_as_not_own(response, field: str) -> dict:
    (error,) = assert_problem(response, 409, "conflict")["errors"]
    assert error["code"] == "attendee_not_own" and error["field"] == field, error
    assert "staff change an address in the admin" in error["detail"], error["detail"]
    return error


def test_an_integration_cannot_take_over_an_attendee_staff_created(
    api_as, make_workshop, make_attendee
):
    """The takeover: the victim's email under a new id of the shop's, then that id with the
    shop's own address; every reminder of the victim's, and its cancel links, would go there."""
    staffs = make_workshop(starts_in=timedelta(hours=5))
    victim = make_attendee(email="vic@example.com", name="Vic", language="de")
    enrollment_create(attendee=victim, workshop=staffs)
    stored = details(victim.pk)
    shop = api_as("enrolments", integration="shop")
    shops = make_workshop(starts_in=timedelta(hours=6))

    renamed = shop.post(
        "/api/enrolments",
        {"workshop": shops.pk, "attendee": {"email": "VIC@example.com", "name": "Mallory",
                                            "external_id": "b-1", "language": "en"}},
    )  # fmt: skip
    # Enrolled, as a shop's form would enrol a person typing their name their own way; the
    # name and language stay as staff set them, and the outcome says so.
    assert renamed.status_code == 201, renamed.content
    assert (renamed.json()["attendee"], renamed.json()["attendee_outcome"]) == (victim.pk, "kept")
    assert details(victim.pk) == stored
    assert AttendeeRef.objects.get(integration__name="shop", external_id="b-1").attendee == victim

    # Its details as they are, or none: unchanged.
    for attendee in ({"name": victim.name}, {}):
        same = shop.post(
            "/api/enrolments",
            {"workshop": shops.pk, "attendee": {"email": "vic@example.com", "external_id": "b-1",
                                                **attendee}},
        )  # fmt: skip
        assert same.status_code == 200, same.content
        assert same.json()["attendee"] == victim.pk
        assert same.json()["attendee_outcome"] == "unchanged"

    # The id with another address: refused, on both paths that upsert an attendee.
    before = counts()
    moved = shop.post(
        "/api/enrolments",
        {"workshop": shops.pk, "attendee": {"email": "mallory@example.net", "external_id": "b-1"}},
    )
    refused_as_not_own(moved, "attendee.email")
    direct = shop.post("/api/attendees", {"email": "mallory@example.net", "external_id": "b-1"})
    refused_as_not_own(direct, "email")
    assert counts() == before and details(victim.pk) == stored
    assert Enrollment.objects.filter(attendee=victim).count() == 2


def test_an_integrations_own_attendee_is_its_to_change_until_another_names_them(
    api_as, make_workshop
):
    shop, lms = api_as("enrolments", integration="shop"), api_as("enrolments", integration="lms")
    workshop = make_workshop(starts_in=timedelta(hours=5))
    lena = lms.post(
        "/api/enrolments",
        {"workshop": workshop.pk, "attendee": {"email": "lena@example.com", "name": "Lena",
                                               "external_id": "l-1"}},
    ).json()["attendee"]  # fmt: skip
    # Its own, by its id or by email: every detail may change.
    moved = lms.post(
        "/api/attendees",
        {"email": "lena@example.org", "name": "Lena B.", "language": "fr", "external_id": "l-1"},
    )
    assert moved.json()["outcome"] == "updated"
    zoned = lms.post("/api/attendees", {"email": "lena@example.org", "timezone": "Europe/Paris"})
    assert zoned.json()["outcome"] == "updated"
    assert details(lena) == ("lena@example.org", "Lena B.", "fr", "Europe/Paris")
    # The lms's, not the shop's: the shop enrols her, her details stay the lms's.
    other, third = (make_workshop(starts_in=timedelta(hours=h)) for h in (6, 7))
    bulk = shop.post(
        "/api/enrolments/bulk",
        {"items": [
            {"workshop": workshop.pk, "attendee": {"email": "sam@example.com", "name": "Sam"}},
            {"workshop": other.pk, "attendee": {"email": "lena@example.org", "name": "L"}},
            {"workshop": third.pk, "attendee": {"email": "lena@example.org", "language": "de",
                                                "timezone": "UTC"}},
        ]},
    )  # fmt: skip
    assert bulk.status_code == 200, bulk.content
    assert [r["attendee_outcome"] for r in bulk.json()["items"]] == ["created", "kept", "kept"]
    assert details(lena) == ("lena@example.org", "Lena B.", "fr", "Europe/Paris")
    # Named by the shop too, she is no longer the lms's alone to change.
    linked = shop.post("/api/attendees", {"email": "lena@example.org", "external_id": "s-7"})
    assert linked.json()["outcome"] == "unchanged" and linked.json()["id"] == lena
    again = lms.post("/api/attendees", {"email": "lena@example.org", "name": "Lena C."})
    assert (again.status_code, again.json()["outcome"]) == (200, "kept")
    refused_as_not_own(
        lms.post("/api/attendees", {"email": "lena@example.com", "external_id": "l-1"}), "email"
    )
    assert details(lena) == ("lena@example.org", "Lena B.", "fr", "Europe/Paris")
    # One the lms made without an id of its own: nothing records her as its own.
    lms.post("/api/attendees", {"email": "noid@example.com", "name": "No Id"})
    kept = lms.post("/api/attendees", {"email": "noid@example.com", "name": "N"})
    assert (kept.status_code, kept.json()["outcome"]) == (200, "kept")


def test_the_migration_marks_the_refs_of_attendees_the_audit_shows_their_integration_created(
    api_as, make_workshop, make_attendee
):
    """Migration 0003 on refs made before it: own where an API write shows the integration
    created the attendee (POST /api/attendees, 201), else not (an enrolments write does not
    say which of its attendees it created)."""
    import importlib

    from django.apps import apps

    mark_created = importlib.import_module(
        "intake.migrations.0003_attendeeref_created_attendee"
    ).mark_created
    shop, lms = api_as("enrolments", integration="shop"), api_as("enrolments", integration="lms")
    workshop = make_workshop(starts_in=timedelta(hours=5))
    made = shop.post("/api/attendees", {"email": "a@example.com", "name": "A", "external_id": "a"})
    idless = shop.post("/api/attendees", {"email": "c@example.com", "name": "C"}).json()["id"]
    shop.post("/api/attendees", {"email": "c@example.com", "external_id": "c"})  # named later
    enrolled = shop.post(
        "/api/enrolments",
        {"workshop": workshop.pk, "attendee": {"email": "b@example.com", "name": "B",
                                               "external_id": "b"}},
    )  # fmt: skip
    staffs = make_attendee(email="e@example.com")
    shop.post("/api/attendees", {"email": "e@example.com", "external_id": "e"})
    lms.post("/api/attendees", {"email": "a@example.com", "external_id": "la"})
    AttendeeRef.objects.update(created_attendee=False)  # as the migration finds them

    mark_created(apps, None)

    marked = dict(AttendeeRef.objects.values_list("external_id", "created_attendee"))
    assert marked == {"a": True, "c": True, "b": False, "e": False, "la": False}
    assert made.status_code == 201 and enrolled.status_code == 201
    assert AttendeeRef.objects.get(external_id="c").attendee_id == idless
    assert AttendeeRef.objects.get(external_id="e").attendee_id == staffs.pk
