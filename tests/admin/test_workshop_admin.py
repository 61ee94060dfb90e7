"""The workshops admin: writes go through workshops.services; nothing is half-saved."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from reminders.models import Reminder
from workshops.models import Enrollment, Workshop
from workshops.services import enrollment_cancel, workshop_cancel, workshop_create

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/workshops/workshop/"


def form_data(
    *,
    title="Django admin deep dive",
    zone="America/New_York",
    starts="2026-03-02 10:00",
    ends="2026-03-02 12:00",
    rows=(),
    **extra,
) -> dict:
    """Return what the workshop form posts; ``rows`` are (enrollment id or "", attendee id, status)."""
    data = {
        "title": title,
        "timezone": zone,
        "starts_at_0": starts.split()[0],
        "starts_at_1": starts.split()[1],
        "ends_at_0": ends.split()[0],
        "ends_at_1": ends.split()[1],
        "enrollments-TOTAL_FORMS": str(len(rows)),
        "enrollments-INITIAL_FORMS": str(sum(1 for row in rows if row[0])),
        "enrollments-MIN_NUM_FORMS": "0",
        "enrollments-MAX_NUM_FORMS": "1000",
        "language": "en",
        "texts-TOTAL_FORMS": "0",
        "texts-INITIAL_FORMS": "0",
        "texts-MIN_NUM_FORMS": "0",
        "texts-MAX_NUM_FORMS": "1000",
        **extra,
    }
    for index, (enrollment_id, attendee_id, status) in enumerate(rows):
        data[f"enrollments-{index}-id"] = str(enrollment_id)
        data[f"enrollments-{index}-attendee"] = str(attendee_id)
        data[f"enrollments-{index}-status"] = status
    return data


def field_errors(response) -> dict:
    return dict(response.context["adminform"].form.errors)


def test_new_workshop_takes_local_time_in_its_zone_and_plans_reminders(admin_client, make_attendee):
    people = [make_attendee(), make_attendee()]
    response = admin_client.post(
        f"{CHANGELIST}add/",
        form_data(rows=[("", p.pk, "active") for p in people]),
    )
    assert response.status_code == 302, field_errors(response)
    workshop = Workshop.objects.get()
    # 10:00 EST is 15:00 UTC.
    assert workshop.starts_at == datetime.fromisoformat("2026-03-02T15:00:00+00:00")
    assert workshop.ends_at == datetime.fromisoformat("2026-03-02T17:00:00+00:00")
    assert list(Reminder.objects.filter(workshop=workshop).values_list("status", flat=True)) == [
        "pending",
        "pending",
    ]


def test_start_in_the_past_is_a_field_error_and_nothing_is_saved(admin_client, make_attendee):
    attendee = make_attendee()
    response = admin_client.post(
        f"{CHANGELIST}add/",
        form_data(
            starts="2026-03-01 10:00", ends="2026-03-01 12:00", rows=[("", attendee.pk, "active")]
        ),
    )
    assert response.status_code == 200
    assert field_errors(response) == {
        "starts_at": ["The start is in the past; give a future start time."]
    }
    assert not Workshop.objects.exists() and not Enrollment.objects.exists()


def test_unknown_zone_is_a_field_error_and_nothing_is_saved(admin_client):
    response = admin_client.post(f"{CHANGELIST}add/", form_data(zone="Mars/Olympus_Mons"))
    assert field_errors(response) == {
        "timezone": [
            "Mars/Olympus_Mons is not a known time zone; use an IANA name such as Europe/Berlin."
        ]
    }
    assert not Workshop.objects.exists()


def test_local_time_skipped_by_daylight_saving_is_refused(admin_client):
    response = admin_client.post(
        f"{CHANGELIST}add/",
        form_data(zone="Europe/Berlin", starts="2026-03-29 02:30", ends="2026-03-29 04:00"),
    )
    assert field_errors(response) == {
        "starts_at": [
            "2026-03-29 02:30 does not exist in Europe/Berlin: the clocks jump forward over it. "
            "Choose a time outside the daylight-saving gap."
        ]
    }
    assert not Workshop.objects.exists()


def test_local_time_repeated_by_daylight_saving_is_refused(admin_client):
    """02:30 on 25 October 2026 in Berlin is both 00:30 and 01:30 UTC: staff choose."""
    response = admin_client.post(
        f"{CHANGELIST}add/",
        form_data(zone="Europe/Berlin", starts="2026-10-25 02:30", ends="2026-10-25 04:00"),
    )
    assert response.status_code == 200
    assert field_errors(response) == {
        "starts_at": [
            "2026-10-25 02:30 happens twice in Europe/Berlin: the clocks go back over it. "
            "Choose a time outside the daylight-saving overlap."
        ]
    }
    assert not Workshop.objects.exists()


@pytest.mark.parametrize(
    ("starts_at", "ends_at"),
    [
        # 02:30 in Berlin's overlap, the first time (CEST), as the API may give it.
        ("2026-10-25T00:30:00+00:00", "2026-10-25T02:00:00+00:00"),
        # Seconds, which the form's HH:MM does not show.
        ("2026-03-02T12:00:30+00:00", "2026-03-02T13:00:45+00:00"),
    ],
)
def test_saving_other_fields_keeps_the_times_as_stored(admin_client, clock, starts_at, ends_at):
    """A workshop the API made at a time the form cannot type: staff edit its place, and the
    times shown unchanged stay as they are (were: refused as happening twice, or cut to the
    minute, a move that told every reminded attendee)."""
    workshop = workshop_create(
        title="Night shift",
        starts_at=datetime.fromisoformat(starts_at),
        ends_at=datetime.fromisoformat(ends_at),
        timezone="Europe/Berlin",
        clock=clock,
    )
    local = workshop.zone
    response = admin_client.post(
        f"{CHANGELIST}{workshop.pk}/change/",
        form_data(
            title=workshop.title,
            zone="Europe/Berlin",
            starts=f"{workshop.starts_at.astimezone(local):%Y-%m-%d %H:%M}",
            ends=f"{workshop.ends_at.astimezone(local):%Y-%m-%d %H:%M}",
            location="Room 7",
        ),
    )
    assert response.status_code == 302, field_errors(response)
    saved = Workshop.objects.get(pk=workshop.pk)
    assert saved.location == "Room 7"
    assert (saved.starts_at, saved.ends_at) == (workshop.starts_at, workshop.ends_at)


def test_end_before_start_is_a_field_error(admin_client):
    response = admin_client.post(
        f"{CHANGELIST}add/", form_data(starts="2026-03-02 12:00", ends="2026-03-02 11:00")
    )
    assert field_errors(response) == {"ends_at": ["The end must be after the start."]}
    assert not Workshop.objects.exists()


def test_change_form_shows_local_time_and_moving_the_start_reschedules_reminders(
    admin_client, make_workshop, enrol
):
    workshop = make_workshop(zone="Asia/Tokyo", starts_in=timedelta(hours=3))  # 12:00 UTC
    (enrollment,) = enrol(workshop, 1)
    page = admin_client.get(f"{CHANGELIST}{workshop.pk}/change/").content.decode()
    assert (
        'value="2026-03-02" name="starts_at_0"' in page
        or 'name="starts_at_0" value="2026-03-02"' in page
    )
    assert 'value="21:00"' in page  # 12:00 UTC is 21:00 JST
    response = admin_client.post(
        f"{CHANGELIST}{workshop.pk}/change/",
        form_data(
            title=workshop.title,
            zone="Asia/Tokyo",
            starts="2026-03-02 23:00",
            ends="2026-03-03 00:00",
            rows=[(enrollment.pk, enrollment.attendee_id, "active")],
            status="cancelled",  # not a form field: ignored
        ),
    )
    assert response.status_code == 302, field_errors(response)
    workshop.refresh_from_db()
    assert workshop.starts_at == datetime.fromisoformat("2026-03-02T14:00:00+00:00")
    assert workshop.status == "scheduled"
    reminder = Reminder.objects.get(workshop=workshop)
    assert reminder.deadline_at == datetime.fromisoformat("2026-03-02T13:30:00+00:00")


def test_save_as_new_copies_no_reminders_and_no_sent_markers(
    admin_client, make_reminders, make_attendee
):
    """S4: the copy is created by workshop_create; its reminders are planned fresh."""
    sent = make_reminders(1, "sent")
    original = Reminder.objects.get(pk=sent[0]).workshop
    failed = make_reminders(1, "failed", workshop=original)
    cancelled = make_reminders(1, "cancelled", workshop=original)
    rows = [
        (e.pk, e.attendee_id, e.status)
        for e in Enrollment.objects.filter(workshop=original).order_by("pk")
    ]
    local = original.starts_at.astimezone(original.zone)
    response = admin_client.post(
        f"{CHANGELIST}{original.pk}/change/",
        form_data(
            title=f"{original.title} (again)",
            zone=original.timezone,
            starts=local.strftime("%Y-%m-%d %H:%M"),
            ends=original.ends_at.astimezone(original.zone).strftime("%Y-%m-%d %H:%M"),
            rows=rows,
            _saveasnew="Save as new",
        ),
    )
    assert response.status_code == 302, field_errors(response)
    copy = Workshop.objects.exclude(pk=original.pk).get()
    assert (copy.title, copy.starts_at, copy.status) == (
        f"{original.title} (again)",
        original.starts_at,
        "scheduled",
    )
    copied = list(Reminder.objects.filter(workshop=copy))
    assert len(copied) == 2  # the cancelled enrollment is not carried over
    assert {
        (r.status, r.attempts, r.sent_at, r.provider_message_id, r.last_error) for r in copied
    } == {("pending", 0, None, "", "")}
    assert set(Reminder.objects.filter(workshop=original).values_list("pk", "status")) == {
        (sent[0], "sent"),
        (failed[0], "failed"),
        (cancelled[0], "cancelled"),
    }


def test_copy_of_a_past_workshop_is_refused_with_a_field_error(admin_client, make_workshop, clock):
    workshop = make_workshop(starts_in=timedelta(hours=1))
    clock.advance(2 * 3600)
    local = workshop.starts_at.astimezone(workshop.zone)
    response = admin_client.post(
        f"{CHANGELIST}{workshop.pk}/change/",
        form_data(
            zone=workshop.timezone,
            starts=local.strftime("%Y-%m-%d %H:%M"),
            ends=(local + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"),
            _saveasnew="Save as new",
        ),
    )
    assert field_errors(response) == {
        "starts_at": ["The start is in the past; give a future start time."]
    }
    assert Workshop.objects.count() == 1


def _post_inline(admin_client, workshop, rows):
    local = workshop.starts_at.astimezone(workshop.zone)
    return admin_client.post(
        f"{CHANGELIST}{workshop.pk}/change/",
        form_data(
            title=workshop.title,
            zone=workshop.timezone,
            starts=local.strftime("%Y-%m-%d %H:%M"),
            ends=workshop.ends_at.astimezone(workshop.zone).strftime("%Y-%m-%d %H:%M"),
            rows=rows,
        ),
    )


def test_enrollment_inline_enrols_through_the_service_and_leaves_cancelling_to_the_action(
    admin_client, make_workshop, enrol, make_attendee
):
    """Issue 34, item 12: a cancel in the inline skipped the cancel permission, the reason
    and the audit. It is refused with the way to do it, and the whole save changes nothing."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (existing,) = enrol(workshop, 1)
    newcomer = make_attendee()
    refused = _post_inline(
        admin_client,
        workshop,
        [(existing.pk, existing.attendee_id, "cancelled"), ("", newcomer.pk, "active")],
    )
    assert refused.status_code == 200
    assert "Cancel selected enrollments" in str(refused.context["errors"])
    statuses = dict(Reminder.objects.filter(workshop=workshop).values_list("attendee_id", "status"))
    assert statuses == {existing.attendee_id: "pending"}

    enrolled = _post_inline(
        admin_client,
        workshop,
        [(existing.pk, existing.attendee_id, "active"), ("", newcomer.pk, "active")],
    )
    assert enrolled.status_code == 302, enrolled.context and enrolled.context["errors"]
    statuses = dict(Reminder.objects.filter(workshop=workshop).values_list("attendee_id", "status"))
    assert statuses == {existing.attendee_id: "pending", newcomer.pk: "pending"}


def test_enrollment_inline_refuses_to_move_an_enrollment_to_another_attendee(
    admin_client, make_workshop, enrol, make_attendee
):
    """Changing a row's attendee would hand one person's reminder (and what it told them) to
    another: it is a field error naming the way to do it, and nothing changes."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (existing,) = enrol(workshop, 1)
    owner, other = existing.attendee_id, make_attendee()
    refused = _post_inline(admin_client, workshop, [(existing.pk, other.pk, "active")])
    assert refused.status_code == 200
    [inline] = [
        f for f in refused.context["inline_admin_formsets"] if f.formset.prefix == "enrollments"
    ]
    assert inline.formset.errors == [
        {
            "attendee": [
                "An enrollment cannot move to another attendee: cancel it and enrol the other "
                "attendee in a new row."
            ]
        }
    ]
    assert list(Enrollment.objects.values_list("pk", "attendee_id", "status")) == [
        (existing.pk, owner, "active")
    ]
    reminder = Reminder.objects.get(workshop=workshop)
    assert (reminder.attendee_id, reminder.status) == (owner, "pending")


def test_enrollment_inline_refuses_to_enrol_anyone_in_a_cancelled_workshop(
    admin_client, make_workshop, enrol, make_attendee
):
    """Neither a new row nor a cancelled row set back to active: the whole save is refused
    with the reason, rather than failing in the enrollment service halfway."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    staying, leaving = enrol(workshop, 2)
    enrollment_cancel(enrollment=leaving)
    workshop = workshop_cancel(workshop=workshop)
    newcomer = make_attendee()
    for rows in (
        [(staying.pk, staying.attendee_id, "active"), ("", newcomer.pk, "active")],
        [(staying.pk, staying.attendee_id, "active"), (leaving.pk, leaving.attendee_id, "active")],
    ):
        refused = _post_inline(admin_client, workshop, rows)
        assert refused.status_code == 200
        assert "This workshop is cancelled; enrol attendees in a scheduled workshop." in str(
            refused.context["errors"]
        )
        assert dict(Enrollment.objects.values_list("attendee_id", "status")) == {
            staying.attendee_id: "active",
            leaving.attendee_id: "cancelled",
        }
        assert set(Reminder.objects.values_list("status", flat=True)) == {"cancelled"}


def test_enrollment_inline_reactivates_a_cancelled_enrollment_and_plans_its_reminder_again(
    admin_client, make_workshop, enrol
):
    """Setting a cancelled row back to active goes through enrollment_create: the same
    enrollment is active again and its cancelled reminder is pending again."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (enrollment,) = enrol(workshop, 1)
    enrollment_cancel(enrollment=enrollment)
    reminder = Reminder.objects.get(enrollment=enrollment)
    assert reminder.status == "cancelled"
    saved = _post_inline(
        admin_client, workshop, [(enrollment.pk, enrollment.attendee_id, "active")]
    )
    assert saved.status_code == 302, saved.context and saved.context["errors"]
    enrollment.refresh_from_db()
    assert enrollment.status == "active"
    assert list(Reminder.objects.values_list("pk", "status", "status_reason")) == [
        (reminder.pk, "pending", "")
    ]


def test_list_counts_reminders_by_status_in_one_query(admin_client, make_reminders):
    make_reminders(2, "failed")
    admin_client.get(CHANGELIST)
    with CaptureQueriesContext(connection) as one:
        first = admin_client.get(CHANGELIST)
    for status in ("sent", "failed", "pending", "unknown", "queued", "cancelled"):
        make_reminders(2, status)
    with CaptureQueriesContext(connection) as seven:
        response = admin_client.get(CHANGELIST)
    assert len(seven) == len(one)
    assert (
        len(first.context["cl"].result_list) == 1 and len(response.context["cl"].result_list) == 7
    )
    html = response.content.decode()
    assert "2&nbsp;failed</a>" in html and "2&nbsp;unknown</a>" in html
    assert "?workshop__id__exact=" in html and "status__exact=failed" in html


def test_the_list_counts_the_reminders_of_its_page_alone(
    admin_client, make_workshop, enrol, monkeypatch
):
    """The counts were annotated on the list's query, so its total, date hierarchy and zone
    choices joined every workshop's reminders, however few the page showed."""
    from reminders.admin.workshop import WorkshopAdmin
    from tests.support.plans import keeping

    monkeypatch.setattr(WorkshopAdmin, "list_per_page", 1)
    for days in (1, 2, 3):
        enrol(make_workshop(starts_in=timedelta(days=days)), 2)
    statements = []
    with connection.execute_wrapper(keeping(statements)):
        response = admin_client.get(CHANGELIST)
    [shown] = response.context["cl"].result_list
    reading = [(sql, params) for sql, params in statements if '"reminders_reminder"' in sql]
    assert [tuple(params) for _, params in reading] == [(shown.pk,)], reading
    assert "2&nbsp;pending</a>" in response.content.decode()


def test_change_page_queries_do_not_grow_with_its_enrollments(admin_client, make_workshop, enrol):
    """Each enrollment row read its attendee twice and its workshop once: a workshop of 2,000
    enrollments was 6,000 queries and 13 s."""
    small, large = make_workshop(), make_workshop()
    enrol(small, 1)
    enrollments = enrol(large, 8)
    admin_client.get(f"{CHANGELIST}{small.pk}/change/")
    with CaptureQueriesContext(connection) as one:
        admin_client.get(f"{CHANGELIST}{small.pk}/change/")
    with CaptureQueriesContext(connection) as eight:
        response = admin_client.get(f"{CHANGELIST}{large.pk}/change/")
    assert len(eight) == len(one)
    # Counted once: the inlines and the enrollments field both read it.
    assert sum("COUNT(*)" in q["sql"] and "workshops_enrollment" in q["sql"] for q in eight) == 1
    html = response.content.decode()
    assert all(f"&lt;{e.attendee.email}&gt;</option>" in html for e in enrollments)


def test_a_workshop_with_the_most_enrollments_its_page_lists_can_be_saved(
    admin_client, make_workshop, enrol, settings
):
    """Every field the largest listing posts fits under Django's limit on fields."""
    from reminders.admin.workshop import INLINE_ENROLLMENTS_MAX

    workshop = make_workshop()
    enrol(workshop, INLINE_ENROLLMENTS_MAX)
    html = admin_client.get(f"{CHANGELIST}{workshop.pk}/change/").content.decode()
    form = html.split('id="workshop_form"', 1)[1].split("</form>", 1)[0]
    assert f'name="enrollments-{INLINE_ENROLLMENTS_MAX - 1}-attendee"' in form
    assert form.count(' name="') < settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    staff_doc = (Path(__file__).resolve().parents[2] / "docs" / "staff.md").read_text()
    assert f"enrollments inline (up to {INLINE_ENROLLMENTS_MAX}:" in staff_doc


def test_a_workshop_with_more_enrollments_lists_them_elsewhere_and_saves(
    admin_client, make_workshop, enrol, clock
):
    """Its page listed every enrollment: past about 250 its save posted more fields than
    Django takes, a 400, so the workshop could not be edited at all."""
    from reminders.admin.workshop import INLINE_ENROLLMENTS_MAX

    workshop = make_workshop(starts_in=timedelta(days=3))
    enrol(workshop, INLINE_ENROLLMENTS_MAX + 60)
    page = admin_client.get(f"{CHANGELIST}{workshop.pk}/change/")
    html = page.content.decode()
    assert "enrollments-TOTAL_FORMS" not in html
    listed = f"/admin/workshops/enrollment/?workshop__id__exact={workshop.pk}"
    assert f'<a href="{listed}">see and add them on the enrollments page</a>' in html
    assert admin_client.get(listed).status_code == 200
    local = workshop.starts_at.astimezone(workshop.zone)
    data = form_data(
        title="Renamed",
        zone=workshop.timezone,
        starts=local.strftime("%Y-%m-%d %H:%M"),
        ends=workshop.ends_at.astimezone(workshop.zone).strftime("%Y-%m-%d %H:%M"),
    )
    del data["enrollments-TOTAL_FORMS"], data["enrollments-INITIAL_FORMS"]
    saved = admin_client.post(f"{CHANGELIST}{workshop.pk}/change/", data)
    assert saved.status_code == 302, saved.context and saved.context["errors"]
    workshop.refresh_from_db()
    assert workshop.title == "Renamed" and workshop.enrollments.count() == 260


def test_enrollment_admin_enrols_through_the_service_and_refuses_a_cancel(
    admin_client, make_workshop, make_attendee
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    attendee = make_attendee()
    added = admin_client.post(
        "/admin/workshops/enrollment/add/",
        {"attendee": attendee.pk, "workshop": workshop.pk, "status": "active"},
    )
    assert added.status_code == 302
    enrollment = Enrollment.objects.get()
    assert Reminder.objects.get(enrollment=enrollment).status == "pending"
    # A cancel is the audited action's (tests/admin/test_enrollment_cancel.py), not the form's.
    changed = admin_client.post(
        f"/admin/workshops/enrollment/{enrollment.pk}/change/", {"status": "cancelled"}
    )
    assert changed.status_code == 200
    assert "Cancel selected enrollments" in str(changed.context["errors"])
    assert Reminder.objects.get(enrollment=enrollment).status == "pending"
    duplicate = admin_client.post(
        "/admin/workshops/enrollment/add/",
        {"attendee": attendee.pk, "workshop": workshop.pk, "status": "active"},
    )
    assert duplicate.status_code == 200
    assert Enrollment.objects.count() == 1


@pytest.mark.parametrize("page", ["enrollment", "workshop"])
def test_enrolling_anew_someone_whose_enrollment_was_cancelled_says_to_set_it_active(
    admin_client, make_workshop, enrol, page
):
    """Adding the pair again was refused with "This attendee is already enrolled in this
    workshop.", the opposite of the truth: staff left them unenrolled, with no reminder."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    (enrollment,) = enrol(workshop, 1)
    enrollment_cancel(enrollment=enrollment)
    attendee = enrollment.attendee_id
    if page == "enrollment":
        response = admin_client.post(
            "/admin/workshops/enrollment/add/",
            {"attendee": attendee, "workshop": workshop.pk, "status": "active"},
        )
    else:
        response = _post_inline(
            admin_client,
            workshop,
            [(enrollment.pk, attendee, "cancelled"), ("", attendee, "active")],
        )
    assert response.status_code == 200
    errors = str(response.context["errors"])
    assert "already enrolled" not in errors
    assert "enrollment in this workshop was cancelled" in errors
    assert "set its status back to active" in errors
    assert Enrollment.objects.get().status == "cancelled"


def test_enrolling_in_a_cancelled_workshop_is_a_field_error(
    admin_client, make_workshop, make_attendee
):
    workshop = make_workshop()
    workshop_cancel(workshop=workshop)
    response = admin_client.post(
        "/admin/workshops/enrollment/add/",
        {"attendee": make_attendee().pk, "workshop": workshop.pk, "status": "active"},
    )
    assert response.context["adminform"].form.errors == {
        "workshop": ["This workshop is cancelled; enrol the attendee in a scheduled workshop."]
    }
    assert not Enrollment.objects.exists()


def test_staff_set_the_place_link_and_organiser_and_an_http_link_is_refused(admin_client):
    details = {
        "location": "Room 4, Kiln House",
        "join_url": "https://meet.example.org/kiln",
        "contact_name": "Ada",
        "contact_email": "ada@example.org",
    }
    response = admin_client.post(f"{CHANGELIST}add/", form_data(**details))
    assert response.status_code == 302, field_errors(response)
    workshop = Workshop.objects.get()
    assert {name: getattr(workshop, name) for name in details} == details

    insecure = form_data(title="Other", join_url="http://meet.example.org/kiln")
    response = admin_client.post(f"{CHANGELIST}add/", insecure)
    assert response.status_code == 200
    [error] = field_errors(response)["join_url"]
    assert error.startswith("The join link must start with https://")
    assert Workshop.objects.count() == 1
    page = admin_client.get(f"{CHANGELIST}{workshop.pk}/change/").content.decode()
    assert "What reminders show" in page


@pytest.mark.parametrize(
    ("starts", "ends"),
    [("9999-12-31 20:00", "9999-12-31 21:00"), ("0001-01-01 01:00", "0001-01-01 02:00")],
)
def test_a_time_at_the_edge_of_the_calendar_is_a_field_error_not_a_500(admin_client, starts, ends):
    """9999-12-31 20:00 in Etc/GMT+12 is in the year 10000 in UTC: refused with a reason."""
    response = admin_client.post(
        f"{CHANGELIST}add/", form_data(zone="Etc/GMT+12", starts=starts, ends=ends)
    )
    assert response.status_code == 200
    assert "enter a date between 1971 and 9998" in str(field_errors(response))
    assert not Workshop.objects.exists()


@pytest.mark.parametrize("year", ["9999", "0", "99999", "x"])
def test_a_date_hierarchy_link_to_no_real_year_is_not_a_500(admin_client, year):
    response = admin_client.get(CHANGELIST, {"starts_at__year": year})
    assert response.status_code in (200, 302)


@pytest.mark.parametrize(
    "date",
    [{"starts_at__month": "9" * 20}, {"starts_at__month": "1", "starts_at__day": "9" * 20}],
)
def test_a_date_hierarchy_link_to_no_real_month_or_day_is_not_a_500(admin_client, date):
    """Django reads the month and day with int() and catches only ValueError: a number past
    what datetime takes was an OverflowError, a 500."""
    response = admin_client.get(CHANGELIST, {"starts_at__year": "2030", **date})
    assert response.status_code == 302 and response.url.endswith("?e=1")


def test_an_erased_attendee_is_not_enrolled_again_from_any_admin_form(
    admin_client, make_workshop, enrol, admin_user
):
    """Erasure cancelled the enrollment: setting it active again, on the workshop's page or on
    its own, or enrolling the attendee anew, is a field error saying what to do (was a 500)."""
    from reminders.services.erasure import attendees_erase
    from workshops.models import Attendee
    from workshops.services import ERASED_NOT_ENROLLED

    workshop = make_workshop(starts_in=timedelta(hours=3))
    (enrollment,) = enrol(workshop, 1)
    attendees_erase(
        attendees=Attendee.objects.filter(pk=enrollment.attendee_id), reason="asked",
        actor=admin_user,
    )  # fmt: skip
    inline = _post_inline(
        admin_client, workshop, [(enrollment.pk, enrollment.attendee_id, "active")]
    )
    own_page = admin_client.post(
        f"/admin/workshops/enrollment/{enrollment.pk}/change/", {"status": "active"}
    )
    anew = admin_client.post(
        "/admin/workshops/enrollment/add/",
        {
            "attendee": enrollment.attendee_id,
            "workshop": make_workshop(starts_in=timedelta(hours=5)).pk,
            "status": "active",
        },
    )
    assert [response.status_code for response in (inline, own_page, anew)] == [200, 200, 200]
    [rows] = [
        i.formset
        for i in inline.context["inline_admin_formsets"]
        if i.formset.prefix == "enrollments"
    ]
    [inline_form] = rows.forms
    assert inline_form.errors == {"status": [ERASED_NOT_ENROLLED]}
    assert field_errors(own_page) == {"status": [ERASED_NOT_ENROLLED]}
    assert field_errors(anew) == {"attendee": [ERASED_NOT_ENROLLED]}
    assert list(Enrollment.objects.values_list("status", flat=True)) == ["cancelled"]


def test_moving_a_workshop_inside_the_cutoff_says_its_reminders_will_not_be_sent(
    admin_client, make_workshop, enrol, clock, settings
):
    """A start moved to less than the cutoff away makes every reminder not yet sent missed:
    those attendees get none. The save said only that the workshop was changed."""
    from tests.admin.conftest import messages_of

    settings.REMINDERS_CUTOFF_MINUTES = 30
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, 2)
    local = (clock.now() + timedelta(minutes=20)).astimezone(workshop.zone)
    response = admin_client.post(
        f"{CHANGELIST}{workshop.pk}/change/",
        form_data(
            title=workshop.title,
            zone=workshop.timezone,
            starts=f"{local:%Y-%m-%d %H:%M}",
            ends=f"{local + timedelta(hours=1):%Y-%m-%d %H:%M}",
        ),
        follow=True,
    )
    assert set(Reminder.objects.values_list("status", flat=True)) == {"missed"}
    said = [m for m in messages_of(response) if "will not be sent" in m]
    assert said == [
        "2 reminders not yet sent will not be sent: the new start is less than the cutoff "
        "(30 minutes) away, so they are missed (unknown, if an earlier call may have reached "
        "the provider). Tell those attendees another way."
    ]
