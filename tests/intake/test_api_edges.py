"""Edges a review of the intake found: erasure racing an upsert, requests naming one person
twice, the database's idea of lower case, zones and dates the admin refuses, racing and
deadlock-prone writers. Each answered as the rest of the API is: a problem, or the same
outcome as a single writer, never a 500."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client

from clock import SystemClock, default_clock
from intake.models import AttendeeRef, Integration, WorkshopRef
from intake.services import AttendeeIn, attendees_upsert
from tests.intake.conftest import Api
from tests.intake.test_api import assert_problem, counts, item
from workshops.models import Attendee, Enrollment, Workshop

pytestmark = pytest.mark.django_db


def run_threads(*targets) -> None:
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def closing(work):
    def run():
        try:
            work()
        finally:
            connection.close()

    return run


def wait_for_a_lock_wait(timeout: float = 10) -> None:
    """Return once another session of this database waits for a row lock (the upsert).

    On the real clock: a fake one installed as the process clock would end the wait at once.
    """
    clock = SystemClock()
    deadline = clock.monotonic() + timeout
    with connection.cursor() as cursor:
        while clock.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # fresh within a transaction
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            clock.sleep_blocking(0.02)
    raise AssertionError(f"no session waited for a lock within {timeout} s")


@pytest.mark.django_db(transaction=True)
def test_an_erasure_committing_while_an_upsert_waits_is_seen_not_undone(make_token):
    """The upsert locks the rows it reads: it waits for the erasure holding Ann's row, then
    sees her erased. The erasure's placeholders stay, and the request is refused as for
    any erased attendee."""
    secret = make_token().secret
    ann = Attendee.objects.create(name="Ann Smith", email="ann@example.com")
    AttendeeRef.objects.create(
        integration=Integration.objects.get(name="shop"), external_id="c-1", attendee=ann
    )
    holding, answers = threading.Event(), []

    def erase():
        with transaction.atomic():
            Attendee.objects.select_for_update().get(pk=ann.pk)
            holding.set()
            wait_for_a_lock_wait()
            Attendee.objects.filter(pk=ann.pk).update(
                name="(erased)", email="erased-x@erased.invalid", erased_at=default_clock().now()
            )

    def upsert():
        assert holding.wait(5), "the erasure never took its lock"
        answers.append(
            Api(Client(), secret).post(
                "/api/attendees",
                {"email": "ann@example.com", "name": "Ann B", "external_id": "c-1"},
            )
        )

    run_threads(closing(erase), closing(upsert))
    assert_problem(answers[0], 409, "conflict")
    assert answers[0].json()["errors"][0]["code"] == "attendee_erased"
    ann.refresh_from_db()
    assert (ann.name, ann.email) == ("(erased)", "erased-x@erased.invalid")


def test_an_erased_placeholder_address_is_refused_and_never_shown(api, django_user_model):
    from reminders.services.erasure import attendees_erase

    made = api.post("/api/attendees", {"email": "ann@example.com", "name": "Ann"}).json()
    staff = django_user_model.objects.create_user("staff")
    attendees_erase(attendees=Attendee.objects.all(), reason="asked", actor=staff)
    shown = api.get(f"/api/attendees/{made['id']}").json()
    assert shown["erased"] and shown["email"] == "" and shown["name"] == ""
    placeholder = Attendee.objects.get().email
    before = counts()
    refused = api.post("/api/attendees", {"email": placeholder, "name": "Ann Real"})
    assert assert_problem(refused, 422, "invalid")["errors"][0]["field"] == "email"
    assert counts() == before


def test_one_person_named_twice_in_a_request_with_different_emails_is_refused(api, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    api.post("/api/attendees", {"email": "a@example.com", "name": "A", "external_id": "E1"})
    before = counts()
    body = {
        "items": [
            item(workshop.pk, 0, email="b@example.com", name="B"),
            item(workshop.pk, 0, email="b@example.com", external_id="E1"),
        ]
    }
    refused = assert_problem(api.post("/api/enrolments/bulk", body), 422, "invalid")
    assert refused["errors"][0]["code"] == "conflicting_items"
    assert counts() == before


def test_two_items_for_one_attendee_both_land(api):
    api.post("/api/attendees", {"email": "ann@example.com", "name": "Ann", "external_id": "E1"})
    attendees_upsert(
        integration=AttendeeRef.objects.get().integration,
        items=[
            AttendeeIn(email="ann@example.com", name="Ann B", external_id="E1"),
            AttendeeIn(email="ann@example.com", language="de"),
        ],
    )
    ann = Attendee.objects.get()
    assert (ann.name, ann.language) == ("Ann B", "de")


def test_the_database_decides_what_lower_case_is(api):
    """Python lowers 'İ' to 'i̇', PostgreSQL to 'i': the second post is the same attendee."""
    first = api.post("/api/attendees", {"email": "a@İx.com", "name": "A"})
    assert first.status_code == 201, first.content
    again = api.post("/api/attendees", {"email": "a@İx.com", "name": "A"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert Attendee.objects.count() == 1


@pytest.mark.parametrize("zone", ["Europe", "posix/Europe/Berlin", "x" * 300])
def test_a_zone_the_admin_does_not_offer_is_refused(api, workshop_body, zone):
    body = assert_problem(api.post("/api/workshops", workshop_body(timezone=zone)), 422, "invalid")
    assert body["errors"][0]["field"] == "timezone"
    refused = api.post("/api/attendees", {"email": "z@example.com", "name": "Z", "timezone": zone})
    assert assert_problem(refused, 422, "invalid")["errors"][0]["field"] == "timezone"
    assert Workshop.objects.count() == Attendee.objects.count() == 0


@pytest.mark.parametrize("zone", ["america/new_york", "AMERICA/NEW_YORK", " America/New_York "])
def test_a_zone_in_another_case_or_with_spaces_is_refused_naming_the_zone_meant(
    api, workshop_body, zone
):
    """A zone name is exact: the refusal says which one was meant, not 'such as Europe/Berlin'."""
    said = f"{zone} is not a known time zone; write it exactly as America/New_York."
    refused = api.post("/api/workshops", workshop_body(timezone=zone))
    assert assert_problem(refused, 422, "invalid")["errors"][0]["detail"] == said
    refused = api.post("/api/attendees", {"email": "z@example.com", "name": "Z", "timezone": zone})
    assert assert_problem(refused, 422, "invalid")["errors"][0]["detail"] == said
    assert Workshop.objects.count() == Attendee.objects.count() == 0


def test_a_date_the_admin_cannot_show_is_refused(api, make_workshop):
    workshop = make_workshop(zone="America/New_York")
    for when in ("0001-01-01T00:00:00+00:00", "9999-12-31T23:00:00-05:00"):
        body = api.patch(f"/api/workshops/{workshop.pk}", {"starts_at": when})
        assert assert_problem(body, 422, "invalid")["errors"][0]["field"] == "starts_at"


def test_the_token_page_is_read_only(admin_client, make_token):
    token = make_token().token
    page = admin_client.post(f"/admin/intake/apitoken/{token.pk}/change/", {"name": "x"})
    assert page.status_code == 403
    assert admin_client.get(f"/admin/intake/apitoken/{token.pk}/change/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_racing_posts_of_one_new_workshop_make_one(make_token, workshop_body):
    secret = make_token().secret
    barrier, answers = threading.Barrier(4), []

    def post():
        api = Api(Client(), secret)
        barrier.wait()
        answers.append(api.post("/api/workshops", workshop_body(external_id="w-9")))

    run_threads(*[closing(post) for _ in range(4)])
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201]
    assert len({a.json()["id"] for a in answers}) == 1
    assert (Workshop.objects.count(), WorkshopRef.objects.count()) == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_racing_bulks_of_the_same_people_in_opposite_orders_neither_deadlock_nor_fail(
    make_token, make_workshop
):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    secret = make_token().secret
    people = [item(workshop.pk, n, external_id=f"p{n}") for n in range(300)]
    barrier, statuses = threading.Barrier(4), []

    def post(items):
        def run():
            api = Api(Client(), secret)
            barrier.wait()
            statuses.append(api.post("/api/enrolments/bulk", {"items": items}).status_code)

        return closing(run)

    run_threads(post(people), post(people[::-1]), post(people[100:]), post(people[:200][::-1]))
    assert statuses == [200] * 4
    assert Attendee.objects.count() == Enrollment.objects.count() == 300


@pytest.mark.django_db(transaction=True)
def test_a_reactivation_waiting_for_another_is_409_already_active(make_token, make_workshop, enrol):
    """Another request reactivates the enrolment while this one is under way: this one waits
    for it and answers as for an active enrolment, not that the request was invalid."""
    from workshops.services import enrollment_cancel

    secret = make_token().secret
    (enrolment,) = enrol(make_workshop(starts_in=timedelta(hours=5)))
    enrollment_cancel(enrollment=enrolment)
    answers = []

    def reactivate():
        answers.append(Api(Client(), secret).post(f"/api/enrolments/{enrolment.pk}/reactivate"))

    thread = threading.Thread(target=closing(reactivate))
    with transaction.atomic():  # the other request, holding the enrolment it reactivates
        Enrollment.objects.select_for_update().filter(pk=enrolment.pk).update(status="active")
        thread.start()
        wait_for_a_lock_wait()
    thread.join()
    assert_problem(answers[0], 409, "already_active")


def test_the_email_filter_finds_the_attendee_an_upsert_of_that_email_finds(api):
    """An email's attendee is judged by the database's LOWER (the unique constraint's): the
    list's email filter judges it so too, not by UPPER ('İ' upper is 'İ', lower 'i')."""
    made = api.post("/api/attendees", {"email": "a@İx.com", "name": "A"}).json()
    same = api.post("/api/attendees", {"email": "A@ix.com"})
    assert same.status_code == 200 and same.json()["id"] == made["id"]
    found = api.get("/api/attendees", email="A@ix.com").json()["items"]
    assert [a["id"] for a in found] == [made["id"]]


def test_two_items_for_one_new_attendee_both_land(db):
    """As for an attendee who exists: the second item's details are not dropped because the
    first one creates her."""
    attendees_upsert(
        integration=Integration.objects.create(name="shop"),
        items=[
            AttendeeIn(email="ann@example.com", name="Ann"),
            AttendeeIn(email="ann@example.com", name="Ann B", language="de"),
        ],
    )
    ann = Attendee.objects.get()
    assert (ann.name, ann.language) == ("Ann B", "de")
