"""The HTTP API: tokens and scopes, idempotent writes, all-or-nothing bulk, the admin's
validation, audit, rate limit and paging, on PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.db import connection
from django.test import Client

from intake.models import ApiWrite, AttendeeRef
from reminders.models import Reminder, StaffDecision
from workshops.models import Attendee, Enrollment, Workshop

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, ...]:
    return (
        Workshop.objects.count(),
        Attendee.objects.count(),
        Enrollment.objects.count(),
        Reminder.objects.count(),
        AttendeeRef.objects.count(),
        ApiWrite.objects.count(),
    )


def item(workshop_id: int, n: int, **attendee) -> dict:
    return {
        "workshop": workshop_id,
        "attendee": {"email": f"person{n}@example.com", "name": f"Person {n}", **attendee},
    }


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["code"] == code, body
    assert body["title"] and body["detail"]
    return body


# ---- access ------------------------------------------------------------------------------


def test_a_missing_wrong_or_revoked_token_gets_401_and_changes_nothing(
    client, make_token, workshop_body, clock, caplog
):
    from intake.tokens import token_revoke
    from tests.intake.conftest import Api

    made = make_token()
    token_revoke(token=made.token, revoked_by="tests")
    before = counts()
    for secret in (None, "wr_not-a-token", made.secret, "Basic abc", "hunter2"):
        with caplog.at_level("WARNING", logger="intake.api.common"):
            response = Api(client, secret).post("/api/workshops", workshop_body())
        body = assert_problem(response, 401, "unauthenticated")
        assert "Bearer" in body["detail"] and response["WWW-Authenticate"].startswith("Bearer")
    assert counts() == before
    # Who sent a wrong token, by the prefix the admin shows; nothing more of a secret.
    assert [r.getMessage() for r in caplog.records if r.name == "intake.api.common"] == [
        "API token refused (unknown, malformed or revoked): wr_not-a- from 127.0.0.1",
        f"API token refused (unknown, malformed or revoked): {made.secret[:9]} from 127.0.0.1",
    ] + ["API token refused (unknown, malformed or revoked): ? from 127.0.0.1"] * 2


def test_a_path_the_api_does_not_have_is_a_problem_document(api_as):
    """It was Django's HTML 404 page, though every API error is a problem document."""
    for path in ("/api/nope", "/api/workshops/1/nope", "/api/workshop"):
        body = assert_problem(api_as("read").get(path), 404, "not_found")
        assert path in body["detail"] and "/api/docs" in body["detail"]


def test_a_token_without_the_scope_gets_403_and_changes_nothing(
    api_as, workshop_body, make_workshop
):
    reader = api_as("read")
    workshop = make_workshop()
    before = counts()
    body = assert_problem(reader.post("/api/workshops", workshop_body()), 403, "forbidden")
    assert "'workshops' scope" in body["detail"]
    assert_problem(reader.post("/api/enrolments", item(workshop.pk, 1)), 403, "forbidden")
    assert_problem(
        api_as("enrolments").post(f"/api/workshops/{workshop.pk}/cancel", {"reason": "x"}),
        403,
        "forbidden",
    )
    assert_problem(api_as("enrolments").get("/api/workshops"), 403, "forbidden")
    assert counts() == before
    assert reader.get("/api/workshops").status_code == 200


def test_the_schema_is_public_and_the_docs_need_a_staff_login(client, admin_client):
    schema = client.get("/api/schema")
    assert schema.status_code == 200
    document = schema.json()
    assert document["openapi"].startswith("3.")
    assert "/api/enrolments/bulk" in document["paths"]
    problem = document["paths"]["/api/workshops"]["post"]["responses"]["422"]["content"]
    assert list(problem) == ["application/problem+json"]
    assert client.get("/api/docs").status_code == 302
    docs = admin_client.get("/api/docs")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    # Served from this site's static files, not a CDN (ninja is no installed app).
    assert b"/static/ninja/swagger-ui-bundle.js" in docs.content
    assert b"cdn" not in docs.content.lower()
    assert finders.find("ninja/swagger-ui-bundle.js") is not None


# ---- workshops ---------------------------------------------------------------------------


def test_a_workshop_posted_twice_under_its_external_id_is_one_workshop(api, workshop_body):
    first = api.post("/api/workshops", workshop_body(external_id="course-7"))
    assert first.status_code == 201, first.content
    again = api.post("/api/workshops", workshop_body(external_id="course-7"))
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["external_id"] == "course-7"
    changed = api.post("/api/workshops", workshop_body(external_id="course-7", title="Other"))
    body = assert_problem(changed, 409, "external_id_taken")
    assert [e["field"] for e in body["errors"]] == ["title"]
    assert Workshop.objects.count() == 1
    found = api.get("/api/workshops", external_id="course-7").json()["items"]
    assert [w["id"] for w in found] == [first.json()["id"]]


def test_a_workshop_that_is_not_there_is_a_problem_document(api):
    assert_problem(api.get("/api/workshops/999999"), 404, "not_found")


def test_a_workshops_external_id_is_one_id_with_or_without_surrounding_spaces(
    api, workshop_body, make_workshop
):
    """As an attendee's: ' course-7 ' and 'course-7' name one workshop wherever they are given."""
    first = api.post("/api/workshops", workshop_body(external_id=" course-7 "))
    assert first.status_code == 201, first.content
    again = api.post("/api/workshops", workshop_body(external_id="course-7"))
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    found = api.get("/api/workshops", external_id="course-7 ").json()["items"]
    assert [w["id"] for w in found] == [first.json()["id"]]
    enrolled = api.post(
        "/api/enrolments",
        {"workshop_external_id": "course-7\t", "attendee": {"email": "p@ex.com", "name": "P"}},
    )
    assert enrolled.status_code == 201, enrolled.content
    for external_id, said in (
        ("   ", "Give a non-blank value, or leave it out."),
        ("c" * 201, "Ensure this value has at most 200 characters (it has 201)."),
    ):
        refused = api.post("/api/workshops", workshop_body(external_id=external_id))
        assert assert_problem(refused, 422, "invalid")["errors"] == [
            {"field": "external_id", "detail": said, "code": "invalid"}
        ]


def _admin_errors(values: dict) -> dict[str, list[str]]:
    """What the admin's workshop form says of ``values`` (times given in the workshop's zone)."""
    from zoneinfo import ZoneInfo

    from django.utils.dateparse import parse_datetime

    from reminders.admin.forms import WorkshopForm

    data = dict(values)
    zone = ZoneInfo("Europe/Berlin")
    for name in ("starts_at", "ends_at"):
        local = parse_datetime(data.pop(name)).astimezone(zone)
        data[f"{name}_0"], data[f"{name}_1"] = f"{local:%Y-%m-%d}", f"{local:%H:%M:%S}"
    form = WorkshopForm(data=data)
    assert not form.is_valid()
    return {name: list(messages) for name, messages in form.errors.items()}


@pytest.mark.parametrize(
    "change",
    [
        {"timezone": "Mars/Olympus"},
        {"reminder_subject": "See you at {venue}"},
        {"notice_intro": "Moved from {old_start_locl}"},
        {"contact_email": "not-an-email"},
        {"join_url": "http://meet.example.com/x"},
        {"ends_at": "starts"},
        {"starts_at": "past"},
    ],
    ids=["zone", "placeholder", "notice-placeholder", "email", "join-url", "end", "past"],
)
def test_the_api_refuses_what_the_admin_refuses_with_the_same_words(
    api, workshop_body, clock, change
):
    values = workshop_body(title="Pottery", language="en")
    if change.get("ends_at") == "starts":
        change = {"ends_at": values["starts_at"]}
    if change.get("starts_at") == "past":
        change = {
            "starts_at": (clock.now() - timedelta(hours=1)).isoformat(),
            "ends_at": clock.now().isoformat(),
        }
    values.update(change)
    response = api.post("/api/workshops", values)
    body = assert_problem(response, 422, "invalid")
    said = {}
    for error in body["errors"]:
        said.setdefault(error["field"], []).append(error["detail"])
    assert said == _admin_errors(values)
    assert Workshop.objects.count() == 0


def test_a_naive_time_is_refused_with_what_to_send(api, workshop_body):
    body = assert_problem(
        api.post("/api/workshops", workshop_body(starts_at="2027-01-01T09:00:00")),
        422,
        "invalid",
    )
    assert body["errors"][0]["field"] == "starts_at"
    assert "time zone" in body["errors"][0]["detail"]


def test_a_title_of_spaces_alone_is_no_title_as_in_the_admin(api, workshop_body, make_workshop):
    """The admin's form strips a title, so spaces alone are none; the API's did not."""
    before = counts()
    body = assert_problem(api.post("/api/workshops", workshop_body(title=" \t ")), 422, "invalid")
    assert [e["field"] for e in body["errors"]] == ["title"]
    assert counts() == before
    workshop = make_workshop(title="Pottery")
    path = f"/api/workshops/{workshop.pk}"
    body = assert_problem(api.patch(path, {"title": "   "}), 422, "invalid")
    assert [e["field"] for e in body["errors"]] == ["title"]
    assert api.patch(path, {"title": " Glazing "}).json()["title"] == "Glazing"


def test_a_patch_moves_the_workshop_and_its_reminders_follow(api, make_workshop, enrol, clock):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    enrol(workshop, 2)
    new_start = clock.now() + timedelta(hours=20)
    response = api.patch(
        f"/api/workshops/{workshop.pk}",
        {
            "starts_at": new_start.isoformat(),
            "ends_at": (new_start + timedelta(hours=1)).isoformat(),
        },
    )
    assert response.status_code == 200, response.content
    workshop.refresh_from_db()
    assert workshop.starts_at == new_start
    null = api.patch(f"/api/workshops/{workshop.pk}", {"title": None})
    assert assert_problem(null, 422, "invalid")["errors"][0]["field"] == "title"
    assert ApiWrite.objects.filter(path=f"/api/workshops/{workshop.pk}").count() == 1


def test_cancel_and_reinstate_are_staff_decisions_attributed_to_the_token(
    api, make_workshop, enrol
):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    enrol(workshop, 3)
    cancelled = api.post(f"/api/workshops/{workshop.pk}/cancel", {"reason": "Teacher ill"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["cancellation_reason"] == "Teacher ill"
    assert set(Reminder.objects.values_list("status", flat=True)) == {"cancelled"}
    decision = StaffDecision.objects.get(action="cancel")
    assert decision.actor is None and decision.actor_name == "api:shop/test"
    assert decision.reason == "Teacher ill" and decision.workshop_ids == [workshop.pk]
    assert_problem(
        api.post(f"/api/workshops/{workshop.pk}/cancel", {"reason": "again"}),
        409,
        "already_cancelled",
    )
    blank = api.post(f"/api/workshops/{workshop.pk}/reinstate", {"reason": "  "})
    assert assert_problem(blank, 422, "invalid")["errors"][0]["field"] == "reason"
    back = api.post(f"/api/workshops/{workshop.pk}/reinstate", {"reason": "Found a teacher"})
    assert back.json()["status"] == "scheduled"
    assert set(Reminder.objects.values_list("status", flat=True)) == {"pending"}
    audits = ApiWrite.objects.order_by("pk")
    assert [a.summary["decision"] for a in audits] == list(
        StaffDecision.objects.order_by("pk").values_list("pk", flat=True)
    )
    assert {a.token_label for a in audits} == {"api:shop/test"}


# ---- enrolments --------------------------------------------------------------------------


def test_the_same_enrolment_posted_twice_is_one_enrolment_and_one_reminder(api, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    first = api.post("/api/enrolments", item(workshop.pk, 1, external_id="c-1"))
    assert first.status_code == 201, first.content
    assert first.json()["outcome"] == "created" and first.json()["attendee_outcome"] == "created"
    again = api.post("/api/enrolments", item(workshop.pk, 1, external_id="c-1"))
    assert again.status_code == 200
    assert again.json() | {"index": 0} == first.json() | {
        "outcome": "unchanged",
        "attendee_outcome": "unchanged",
    }
    assert Enrollment.objects.count() == 1
    assert Reminder.objects.count() == 1  # inside the lead: planned with the enrolment
    assert ApiWrite.objects.count() == 1  # the repeat wrote nothing


@pytest.mark.parametrize("action", ["cancel enrolment", "cancel workshop", "reinstate workshop"])
def test_a_decision_another_request_made_first_is_a_409_and_no_audit(
    api, make_workshop, enrol, monkeypatch, action
):
    """The view reads the row, then another request decides it before the service runs:
    the service changes nothing, and the answer says so instead of 200."""
    import importlib

    # The modules, not the routers of the same names that intake.api exports.
    enrolment_views = importlib.import_module("intake.api.enrolments")
    workshop_views = importlib.import_module("intake.api.workshops")

    workshop = make_workshop(starts_in=timedelta(hours=5))
    (enrolment,) = enrol(workshop)
    if action == "reinstate workshop":
        api.post(f"/api/workshops/{workshop.pk}/cancel", {"reason": "Teacher ill"})
        workshop.refresh_from_db()
    views, stale, path, code = {
        "cancel enrolment": (
            enrolment_views, enrolment, f"/api/enrolments/{enrolment.pk}/cancel",
            "already_cancelled",
        ),
        "cancel workshop": (
            workshop_views, workshop, f"/api/workshops/{workshop.pk}/cancel", "already_cancelled"
        ),
        "reinstate workshop": (
            workshop_views, workshop, f"/api/workshops/{workshop.pk}/reinstate", "not_cancelled"
        ),
    }[action]  # fmt: skip
    # The other request, committed between the view's read and its service call.
    if action == "cancel enrolment":
        Enrollment.objects.filter(pk=enrolment.pk).update(status="cancelled")
    elif action == "cancel workshop":
        Workshop.objects.filter(pk=workshop.pk).update(status="cancelled")
    else:
        Workshop.objects.filter(pk=workshop.pk).update(status="scheduled")
    monkeypatch.setattr(views, "get_or_404", lambda *args: stale)
    audits = ApiWrite.objects.count()
    assert_problem(api.post(path, {"reason": "Both at once"}), 409, code)
    assert ApiWrite.objects.count() == audits


@pytest.mark.parametrize("action", ["cancel enrolment", "cancel workshop", "reinstate workshop"])
def test_a_decision_whose_api_write_fails_is_not_made(api, make_workshop, enrol, action):
    """The staff decision and the API write naming it are one transaction: neither is kept
    without the other."""
    from django.db.models.signals import pre_save

    workshop = make_workshop(starts_in=timedelta(hours=5))
    (enrolment,) = enrol(workshop)
    if action == "reinstate workshop":
        api.post(f"/api/workshops/{workshop.pk}/cancel", {"reason": "Teacher ill"})
    path = {
        "cancel enrolment": f"/api/enrolments/{enrolment.pk}/cancel",
        "cancel workshop": f"/api/workshops/{workshop.pk}/cancel",
        "reinstate workshop": f"/api/workshops/{workshop.pk}/reinstate",
    }[action]

    def state():
        return (
            StaffDecision.objects.count(),
            ApiWrite.objects.count(),
            Workshop.objects.get(pk=workshop.pk).status,
            Enrollment.objects.get(pk=enrolment.pk).status,
            sorted(Reminder.objects.values_list("status", flat=True)),
        )

    def refuse(**kwargs):
        raise RuntimeError("the API write fails")

    before = state()
    pre_save.connect(refuse, sender=ApiWrite)
    try:
        with pytest.raises(RuntimeError, match="the API write fails"):
            api.post(path, {"reason": "Both or neither"})
    finally:
        pre_save.disconnect(refuse, sender=ApiWrite)
    assert state() == before


def test_a_repost_never_brings_back_a_cancelled_enrolment_reactivation_does(api, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    made = api.post("/api/enrolments", item(workshop.pk, 1)).json()
    cancelled = api.post(f"/api/enrolments/{made['enrolment']}/cancel", {"reason": "Refunded"})
    assert cancelled.json()["status"] == "cancelled"
    assert StaffDecision.objects.get(action="cancel_enrol").actor_name == "api:shop/test"
    before = counts()
    body = assert_problem(api.post("/api/enrolments", item(workshop.pk, 1)), 409, "conflict")
    assert body["errors"][0]["code"] == "enrolment_cancelled"
    assert f"/api/enrolments/{made['enrolment']}/reactivate" in body["errors"][0]["detail"]
    assert counts() == before
    back = api.post(f"/api/enrolments/{made['enrolment']}/reactivate")
    assert back.status_code == 200 and back.json()["status"] == "active"
    assert Reminder.objects.get().status == "pending"


def test_a_repost_never_brings_back_an_erased_attendee(api, make_workshop, django_user_model):
    from reminders.services.erasure import attendees_erase

    workshop = make_workshop(starts_in=timedelta(hours=5))
    api.post("/api/enrolments", item(workshop.pk, 1, external_id="c-1"))
    staff = django_user_model.objects.create_user("staff")
    attendees_erase(attendees=Attendee.objects.all(), reason="asked", actor=staff)
    before = counts()
    for path, body in (
        ("/api/enrolments", item(workshop.pk, 1, external_id="c-1")),
        ("/api/attendees", item(workshop.pk, 1, external_id="c-1")["attendee"]),
    ):
        refused = assert_problem(api.post(path, body), 409, "conflict")
        assert refused["errors"][0]["code"] == "attendee_erased"
    assert counts() == before


def test_a_bulk_of_1000_is_written_whole_and_a_repost_changes_nothing(api, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    items = [item(workshop.pk, n, external_id=f"p{n}") for n in range(1000)]
    response = api.post("/api/enrolments/bulk", {"items": items})
    assert response.status_code == 200, response.content[:500]
    assert response.json()["created"] == 1000
    assert Reminder.objects.filter(status="pending").count() == 1000
    again = api.post("/api/enrolments/bulk", {"items": items})
    assert again.json()["unchanged"] == 1000 and again.json()["created"] == 0
    assert [r["enrolment"] for r in again.json()["items"]] == [
        r["enrolment"] for r in response.json()["items"]
    ]
    assert (Enrollment.objects.count(), Reminder.objects.count()) == (1000, 1000)


def test_one_invalid_item_refuses_the_bulk_with_each_items_reason_and_writes_nothing(
    api, make_workshop
):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    items = [item(workshop.pk, n) for n in range(50)]
    items[7]["attendee"]["email"] = "not an email"
    items[31]["attendee"]["timezone"] = "Mars/Olympus"
    items[40]["workshop"] = workshop.pk + 1000
    before = counts()
    body = assert_problem(api.post("/api/enrolments/bulk", {"items": items}), 422, "invalid")
    assert [(e["index"], e["field"]) for e in body["errors"]] == [
        (7, "attendee.email"),
        (31, "attendee.timezone"),
        (40, "workshop"),
    ]
    assert "Mars/Olympus is not a known time zone" in body["errors"][1]["detail"]
    assert counts() == before


def test_a_bulk_over_1000_is_refused_before_anything_is_read(api, make_workshop):
    workshop = make_workshop()
    body = assert_problem(
        api.post("/api/enrolments/bulk", {"items": [item(workshop.pk, n) for n in range(1001)]}),
        422,
        "invalid",
    )
    assert body["errors"][0]["field"] == "items"


def test_external_ids_are_per_integration_and_an_email_is_one_attendees(api_as, make_workshop):
    shop, lms = api_as("enrolments", integration="shop"), api_as("enrolments", integration="lms")
    workshop = make_workshop(starts_in=timedelta(hours=5))
    a = shop.post("/api/enrolments", item(workshop.pk, 1, external_id="42")).json()
    # Another integration's "42" is its own; the same email is the same attendee.
    b = lms.post("/api/enrolments", item(workshop.pk, 1, external_id="x-9")).json()
    assert b["attendee"] == a["attendee"] and b["outcome"] == "unchanged"
    c = lms.post("/api/attendees", {"email": "other@example.com", "name": "O", "external_id": "42"})
    assert c.status_code == 201 and c.json()["id"] != a["attendee"]
    # One integration, one id per attendee: the email under a second id is a conflict.
    before = counts()
    clash = shop.post("/api/attendees", {"email": "person1@example.com", "external_id": "43"})
    assert assert_problem(clash, 409, "conflict")["errors"][0]["code"] == "external_id_mismatch"
    # Its id moving to an address that is another attendee's is a conflict too.
    taken = shop.post("/api/attendees", {"email": "other@example.com", "external_id": "42"})
    (error,) = assert_problem(taken, 409, "conflict")["errors"]
    assert error["code"] == "email_taken"
    # It says what to do: the other attendee has no id of the shop's.
    assert error["detail"].endswith(
        "correct the email, or, to mean that attendee, send it without external_id."
    ), error["detail"]
    # Its id may carry a changed email that nobody else has, if the attendee is its own:
    # the shop's 42, whom the lms also names, keeps her email; the lms's own 42 moves.
    shared = shop.post("/api/attendees", {"email": "new@example.com", "external_id": "42"})
    assert assert_problem(shared, 409, "conflict")["errors"][0]["code"] == "attendee_not_own"
    assert counts() == before
    moved = lms.post("/api/attendees", {"email": "new@example.com", "external_id": "42"})
    assert moved.json()["outcome"] == "updated"
    assert Attendee.objects.get(pk=c.json()["id"]).email == "new@example.com"


def test_an_upsert_leaves_out_what_it_is_not_given(api):
    made = api.post(
        "/api/attendees",
        {"email": "Ann@Example.com", "name": "Ann", "language": "de", "external_id": "ann"},
    ).json()
    same = api.post("/api/attendees", {"email": "ann@example.com"})
    assert same.status_code == 200 and same.json()["outcome"] == "unchanged"
    assert same.json()["language"] == "de" and same.json()["id"] == made["id"]
    cleared = api.post("/api/attendees", {"email": "ann@example.com", "language": ""})
    assert cleared.json()["outcome"] == "updated" and cleared.json()["language"] == ""
    nameless = api.post("/api/attendees", {"email": "new@example.com"})
    assert assert_problem(nameless, 422, "invalid")["errors"][0]["field"] == "name"


@pytest.mark.django_db(transaction=True)
def test_racing_bulk_posts_of_the_same_people_enrol_each_once(make_token, make_workshop):
    """Four threads post overlapping new attendees at once: each person is one attendee with
    one enrolment and one reminder; every request answers 200."""
    from tests.intake.conftest import Api

    workshop = make_workshop(starts_in=timedelta(hours=5))
    secret = make_token().secret
    barrier = threading.Barrier(4)
    statuses = []

    def post(offset: int) -> None:
        api = Api(Client(), secret)
        items = [item(workshop.pk, n, external_id=f"r{n}") for n in range(offset, offset + 200)]
        barrier.wait()
        try:
            statuses.append(api.post("/api/enrolments/bulk", {"items": items}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(offset,)) for offset in (0, 50, 100, 150)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 4
    assert Attendee.objects.count() == 350
    assert Enrollment.objects.count() == 350
    assert Reminder.objects.count() == 350
    assert AttendeeRef.objects.count() == 350


# ---- reading, limits, paging -------------------------------------------------------------


def test_reminders_are_read_with_their_notices_and_history_filtered_by_workshop_and_status(
    api, make_workshop, enrol
):
    one, two = (
        make_workshop(starts_in=timedelta(hours=5)),
        make_workshop(starts_in=timedelta(hours=6)),
    )
    enrol(one, 3)
    enrol(two, 2)
    listed = api.get("/api/reminders", workshop=one.pk, status="pending").json()
    assert len(listed["items"]) == 3 and {r["workshop"] for r in listed["items"]} == {one.pk}
    assert api.get("/api/reminders", workshop=one.pk, status="sent").json()["items"] == []
    detail = api.get(f"/api/reminders/{listed['items'][0]['id']}").json()
    assert detail["history"] == [] and detail["notices"] == []
    bad = api.get("/api/reminders", status="lost")
    assert assert_problem(bad, 422, "invalid")["errors"][0]["field"] == "status"


def test_every_list_pages(api, make_workshop, enrol):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    make_workshop(starts_in=timedelta(hours=6))
    enrol(workshop, 5)
    seen = []
    for page in (1, 2, 3):
        body = api.get("/api/enrolments", workshop=workshop.pk, page=page, page_size=2).json()
        seen += [e["id"] for e in body["items"]]
        assert body["has_next"] == (page < 3)
    assert len(seen) == len(set(seen)) == 5
    for path in ("/api/workshops", "/api/attendees", "/api/reminders", "/api/enrolments"):
        body = api.get(path, page_size=1).json()
        assert body["page_size"] == 1 and len(body["items"]) == 1 and body["has_next"]
    assert_problem(api.get("/api/workshops", page_size=501), 422, "invalid")


def test_past_its_rate_a_token_gets_429_with_retry_after(api_as, settings, clock):
    settings.REMINDERS_API_RATE = "3/minute"
    reader, other = api_as("read"), api_as("read")
    clock.advance(60 - clock.now().timestamp() % 60 + 15)
    assert [reader.get("/api/workshops").status_code for _ in range(3)] == [200] * 3
    limited = reader.get("/api/workshops")
    assert_problem(limited, 429, "rate_limited")
    assert limited["Retry-After"] == "45"
    assert other.get("/api/workshops").status_code == 200  # per token
    clock.advance(45)
    assert reader.get("/api/workshops").status_code == 200


def test_a_malformed_item_is_named_by_its_index_and_nothing_is_written(api, make_workshop):
    workshop = make_workshop()
    items = [item(workshop.pk, n) for n in range(5)]
    items[3]["workshop"] = "seven"
    body = assert_problem(api.post("/api/enrolments/bulk", {"items": items}), 422, "invalid")
    assert [(e["index"], e["field"]) for e in body["errors"]] == [(3, "workshop")]
    assert counts()[1:3] == (0, 0)


def test_a_body_that_is_no_json_or_too_large_gets_a_problem_and_changes_nothing(
    api, make_workshop, settings
):
    workshop = make_workshop()
    broken = api.client.post(
        "/api/enrolments/bulk",
        "{not json",
        content_type="application/json",
        headers=api._headers(),
    )
    assert broken.status_code in (400, 422) and broken["Content-Type"] == "application/problem+json"
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    big = [item(workshop.pk, n, name="x" * 150) for n in range(100)]
    body = assert_problem(api.post("/api/enrolments/bulk", {"items": big}), 413, "too_large")
    assert "fewer items" in body["detail"]
    assert counts()[1:3] == (0, 0)


@pytest.mark.parametrize(
    "values",
    [
        {"email": "not-an-email", "name": "A"},
        {"email": "a@example.invalid", "name": "A"},
        {"email": ("x" * 65) + "@example.com", "name": "A"},
        {"email": "a@example.com", "name": "A", "timezone": "Mars/Olympus"},
        {"email": "a@example.com", "name": "A", "timezone": "Europe"},
        {"email": "a@example.com", "name": "x" * 201},
        {
            "email": "a@" + ".".join(["b" * 62] * 4) + ".com",  # 257 characters
            "name": "A",
        },
    ],
    ids=[
        "email",
        "reserved-domain",
        "long-local-part",
        "zone",
        "zone-folder",
        "long-name",
        "long-email",
    ],
)
def test_an_attendee_is_refused_as_the_admins_attendee_form_refuses_it(api, values):
    from reminders.admin.forms import AttendeeForm

    form = AttendeeForm(data={"language": "", "timezone": "", **values})
    assert not form.is_valid()
    response = api.post("/api/attendees", values)
    said = {}
    for error in assert_problem(response, 422, "invalid")["errors"]:
        said.setdefault(error["field"], []).append(error["detail"])
    assert said == {name: list(messages) for name, messages in form.errors.items()}
    assert Attendee.objects.count() == 0


@pytest.mark.parametrize(
    ("email", "says"),
    [
        ("ada@example.com.", "The address ends with a dot: remove it."),
        ("ada @example.com", "The address has a space in it: remove it."),
        (
            "ada@@example.com",
            "The address has more than one @: keep only the one before the domain.",
        ),
    ],
    ids=["trailing-dot", "space", "two-at"],
)
def test_a_slip_in_an_email_is_refused_saying_what_to_correct(api, admin_client, email, says):
    """Not Django's bare 'Enter a valid email address.', in the API as in the admin."""
    page = admin_client.post(
        "/admin/workshops/attendee/add/", {"name": "Ada", "email": email, "language": "en"}
    )
    assert page.status_code == 200 and page.context["adminform"].form.errors["email"] == [says]
    response = api.post("/api/attendees", {"email": email, "name": "Ada"})
    (error,) = assert_problem(response, 422, "invalid")["errors"]
    assert (error["field"], error["detail"]) == ("email", says)
    assert Attendee.objects.count() == 0


def test_with_the_cache_unreachable_requests_are_served_and_the_outage_logged(
    api, settings, refusing_port, caplog
):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{refusing_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 1},
        }
    }
    assert api.get("/api/workshops").status_code == 200
    assert "API rate limit not counted (the cache is unreachable" in caplog.text


def test_a_patch_that_changes_nothing_leaves_no_audit_and_names_only_what_changed(
    api, make_workshop
):
    workshop = make_workshop(starts_in=timedelta(hours=5), location="Room 1")
    path = f"/api/workshops/{workshop.pk}"
    for body in ({}, {"title": workshop.title, "location": "Room 1"}):
        assert api.patch(path, body).status_code == 200
    assert ApiWrite.objects.count() == 0
    assert api.patch(path, {"title": workshop.title, "location": "Room 2"}).status_code == 200
    assert ApiWrite.objects.get().summary["changed"] == ["location"]


@pytest.mark.parametrize("since", ["workshop cancelled", "attendee erased"])
def test_a_reactivation_the_data_refuses_is_a_409_naming_why(
    api, make_workshop, enrol, django_user_model, since
):
    """Nothing in the request is invalid (it has no body): the workshop or attendee as they are
    now refuse it, as the bulk's workshop_cancelled and attendee_erased are 409s."""
    from reminders.services.erasure import attendees_erase
    from workshops.services import enrollment_cancel

    workshop = make_workshop(starts_in=timedelta(hours=5))
    (enrolment,) = enrol(workshop)
    enrollment_cancel(enrollment=enrolment)
    if since == "workshop cancelled":
        api.post(f"/api/workshops/{workshop.pk}/cancel", {"reason": "Teacher ill"})
    else:
        staff = django_user_model.objects.create_user("staff")
        attendees_erase(attendees=Attendee.objects.all(), reason="asked", actor=staff)
    before = counts()
    body = assert_problem(api.post(f"/api/enrolments/{enrolment.pk}/reactivate"), 409, "conflict")
    field, code = {
        "workshop cancelled": ("workshop", "workshop_cancelled"),
        "attendee erased": ("attendee", "attendee_erased"),
    }[since]
    assert [(e["field"], e["code"]) for e in body["errors"]] == [(field, code)]
    assert counts() == before
    assert Enrollment.objects.get().status == "cancelled"


def test_an_api_write_records_the_status_its_request_was_answered_with(api, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    one = api.post("/api/enrolments", item(workshop.pk, 1))
    bulk = api.post("/api/enrolments/bulk", {"items": [item(workshop.pk, 2)]})
    assert (one.status_code, bulk.status_code) == (201, 200)
    assert list(ApiWrite.objects.order_by("pk").values_list("status", flat=True)) == [201, 200]


def test_an_item_naming_two_different_workshops_is_refused_not_enrolled_in_one(
    api, make_workshop, workshop_body
):
    """workshop and workshop_external_id are two names for one workshop: when they name two,
    which was meant is not known, and neither is chosen silently."""
    course = api.post("/api/workshops", workshop_body(external_id="course-7")).json()
    other = make_workshop(starts_in=timedelta(hours=5))
    both = {**item(other.pk, 1), "workshop_external_id": "course-7"}
    before = counts()
    body = assert_problem(api.post("/api/enrolments/bulk", {"items": [both]}), 422, "invalid")
    assert [(e["index"], e["field"]) for e in body["errors"]] == [(0, "workshop_external_id")]
    assert f"names workshop {course['id']}, not workshop {other.pk}" in body["errors"][0]["detail"]
    assert counts() == before
    same = {**item(course["id"], 1), "workshop_external_id": "course-7"}
    assert api.post("/api/enrolments", same).status_code == 201


def test_a_field_the_api_does_not_know_is_refused_not_dropped(api, make_workshop, workshop_body):
    """A misspelt or unsupported field would otherwise answer 200 with nothing of it done."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    before = counts()
    for send, body, field in (
        (api.patch, {"status": "cancelled"}, "status"),
        (api.patch, {"titel": "Glazing"}, "titel"),
        (api.post, {"title": "Glazing", "locaton": "Room 2"}, "locaton"),
    ):
        path = f"/api/workshops/{workshop.pk}" if send == api.patch else "/api/workshops"
        if send == api.post:
            body = workshop_body(**body)
        refused = assert_problem(send(path, body), 422, "invalid")
        assert [(e["field"], e["code"]) for e in refused["errors"]] == [(field, "invalid")]
        assert "schema" in refused["errors"][0]["detail"]
    nested = {
        "items": [
            {
                **item(workshop.pk, 1),
                "attendee": {"email": "a@example.com", "name": "A", "lang": "de"},
            }
        ]
    }
    refused = assert_problem(api.post("/api/enrolments/bulk", nested), 422, "invalid")
    assert [(e["index"], e["field"]) for e in refused["errors"]] == [(0, "attendee.lang")]
    workshop.refresh_from_db()
    assert workshop.status == "scheduled" and counts() == before
