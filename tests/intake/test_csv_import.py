"""The admin's CSV import (preview, all or nothing, clear refusals) and export (own
permission, audited, formulas escaped), through the admin's views on PostgreSQL."""

from __future__ import annotations

import codecs
import csv
import io
from datetime import timedelta
from functools import partial

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from intake.models import AttendeeRef, CsvTransfer
from reminders.models import Reminder
from workshops.models import Attendee, Enrollment

pytestmark = pytest.mark.django_db

GOOD = (
    "name,email,language,timezone,external_id\n"
    "Ada Lovelace,ada@example.com,en,Europe/London,a-1\n"
    "Émile Zola,emile@example.com,fr,,a-2\n"
    "Grace Hopper,grace@example.com,,America/New_York,\n"
)


@pytest.fixture
def staff(django_user_model):
    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(
            username=f"staff-{'-'.join(codenames) or 'none'}", password="pw", is_staff=True
        )
        for codename in ("view_workshop", "change_workshop", *codenames):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def importer(staff):
    return staff("import_attendees")


def upload(client, workshop, data: bytes | str, *, name="attendees.csv", integration="csv"):
    if isinstance(data, str):
        data = data.encode()
    return client.post(
        f"/admin/intake/csvtransfer/import/{workshop.pk}/",
        {
            "file": SimpleUploadedFile(name, data, content_type="text/csv"),
            "integration": integration,
        },
    )


def confirm(client, workshop, preview):
    context = preview.context
    return client.post(
        f"/admin/intake/csvtransfer/import/{workshop.pk}/",
        {
            "csv_text": context["csv_text"],
            "filename_seen": context["filename"],
            "integration": context["form"].cleaned_data["integration"],
            "request_token": context.get("request_token", ""),
            "confirm": "yes",
        },
    )


def state() -> tuple[int, ...]:
    return (
        Attendee.objects.count(),
        Enrollment.objects.count(),
        Reminder.objects.count(),
        AttendeeRef.objects.count(),
    )


def test_the_preview_shows_each_rows_outcome_and_writes_nothing_until_confirmed(
    importer, make_workshop, make_attendee
):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    make_attendee(email="Grace@Example.com", name="Grace Hopper")
    preview = upload(importer, workshop, GOOD)
    assert preview.status_code == 200
    outcomes = [row.outcome for row in preview.context["preview"].rows]
    assert outcomes == [
        "New attendee, enrolled",
        "New attendee, enrolled",
        "Existing attendee (details updated), enrolled",
    ]
    assert state() == (1, 0, 0, 0)
    done = confirm(importer, workshop, preview)
    assert done.status_code == 302
    assert state() == (3, 3, 3, 2)  # inside the lead: each reminder planned with its enrolment
    assert Attendee.objects.get(email="emile@example.com").language == "fr"
    assert Attendee.objects.get(email="Grace@Example.com").timezone == "America/New_York"
    audit = CsvTransfer.objects.get()
    assert (audit.kind, audit.rows, audit.created, audit.unchanged) == ("import", 3, 3, 0)
    assert audit.filename == "attendees.csv" and audit.actor_name.startswith("staff-")


def test_reimporting_the_same_file_changes_nothing(importer, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    confirm(importer, workshop, upload(importer, workshop, GOOD))
    before = state()
    again = upload(importer, workshop, GOOD)
    assert {row.outcome for row in again.context["preview"].rows} == {"Already enrolled"}
    confirm(importer, workshop, again)
    assert state() == before
    assert CsvTransfer.objects.order_by("pk").last().unchanged == 3


def test_a_confirmation_posted_twice_imports_once_and_says_so(importer, make_workshop):
    """A double click, or the browser sending the form again: one import, one record; the
    second answer names the first import. A file previewed again is imported again."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    preview = upload(importer, workshop, GOOD)
    confirm(importer, workshop, preview)
    audit = CsvTransfer.objects.get()
    again = confirm(importer, workshop, preview)
    assert again.status_code == 302
    *_, message = [str(m) for m in get_messages(again.wsgi_request)]
    assert message.startswith(f"This file was already imported (import {audit.pk}")
    assert CsvTransfer.objects.count() == 1 and state() == (3, 3, 3, 2)
    changed = upload(importer, workshop, GOOD + "Alan Turing,alan@example.com,,,\n")
    confirm(importer, workshop, changed)
    assert CsvTransfer.objects.count() == 2 and state() == (4, 4, 4, 2)


@pytest.mark.django_db(transaction=True)
def test_two_confirmations_of_one_preview_at_once_import_once(importer, make_workshop):
    """The two posts of a double click may run at once: the second waits for the first and
    imports nothing. Raced five times, a new file each round."""
    from tests.support.races import race

    twin = Client()
    twin.cookies = importer.cookies
    for round_ in range(5):
        workshop = make_workshop(starts_in=timedelta(hours=5))
        data = "".join(f"P{round_}-{i},p{round_}-{i}@example.com\n" for i in range(20))
        preview = upload(importer, workshop, "name,email\n" + data)
        answers = race(*(partial(confirm, c, workshop, preview) for c in (importer, twin)))
        assert [answer.status_code for answer in answers] == [302, 302]
        assert CsvTransfer.objects.filter(workshop=workshop).count() == 1
        assert Enrollment.objects.filter(workshop=workshop).count() == 20


def test_one_invalid_row_blocks_the_import_and_the_preview_names_it(importer, make_workshop):
    workshop = make_workshop()
    bad = GOOD + "No Email,,de,,\nBad Zone,zone@example.com,en,Mars/Olympus,\n"
    preview = upload(importer, workshop, bad)
    assert preview.status_code == 400
    rows = preview.context["preview"].rows
    invalid = [(row.line, row.reasons) for row in rows if row.reasons]
    assert invalid == [
        (5, ["email: This field cannot be blank."]),
        (
            6,
            [
                "timezone: Mars/Olympus is not a known time zone; use an IANA name such as Europe/Berlin."
            ],
        ),
    ]
    assert b'id="import-confirm"' not in preview.content
    assert b"Nothing is imported while one row is invalid" in preview.content
    # Posting a confirmation anyway writes nothing either.
    forced = importer.post(
        f"/admin/intake/csvtransfer/import/{workshop.pk}/",
        {"csv_text": bad, "integration": "csv", "confirm": "yes"},
    )
    assert forced.status_code == 400
    assert state() == (0, 0, 0, 0) and not CsvTransfer.objects.exists()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "The file is empty"),
        (b"name,email\n", "no attendees below it"),
        ("name,email\nZoë,zoe@example.com\n".encode("latin-1"), "not UTF-8 (line 2"),
        (b"PK\x03\x04\x14\x00\x06\x00\x08\x00", "not a CSV file"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a CSV file"),
        (b"full name,mail\nAda,ada@example.com\n", "no name or email column"),
        (b'name,email\n"Ada,ada@example.com\n', "not valid CSV"),
        (b"name,email\nAda,ada@example.com,extra,cells\n", "Line 2 has 4 cells"),
        (
            ("name,email\n" + "".join(f"P{i},p{i}@example.com\n" for i in range(100_000))).encode(),
            "5,000 rows): split it",
        ),
    ],
    ids=[
        "empty",
        "header-only",
        "latin-1",
        "xlsx",
        "png",
        "columns",
        "quotes",
        "cells",
        "100k-rows",
    ],
)
def test_a_file_that_cannot_be_read_gets_a_clear_message_not_a_500(
    importer, make_workshop, data, says
):
    workshop = make_workshop()
    response = upload(importer, workshop, data)
    assert response.status_code == 400
    assert says in response.context["refusal"], response.context["refusal"]
    assert b'id="import-refusal"' in response.content
    assert state() == (0, 0, 0, 0)


def test_a_huge_file_is_refused_by_size_before_it_is_parsed(importer, make_workshop):
    workshop = make_workshop()
    data = b"name,email\n" + b"x" * (3 * 1024 * 1024)
    response = upload(importer, workshop, data)
    assert response.status_code == 400 and "split it" in response.context["refusal"]


def test_semicolons_and_a_byte_order_mark_are_read(importer, make_workshop):
    workshop = make_workshop()
    data = "\ufeffName;Email\nJosé;jose@example.com\n".encode()
    preview = upload(importer, workshop, data)
    assert [r.email for r in preview.context["preview"].rows] == ["jose@example.com"]


def test_ids_in_the_file_are_the_named_integrations(importer, make_workshop, make_token, client):
    """An integration's API ids and its CSV ids name the same attendee."""
    import json

    workshop = make_workshop(starts_in=timedelta(hours=5))
    secret = make_token(integration="shop").secret
    client.post(
        "/api/attendees",
        json.dumps({"email": "ada@example.com", "name": "Ada", "external_id": "a-1"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )
    # In the shop's ids Ada is a-1: the file calling her b-9 is refused, and says so.
    clash = "name,email,external_id\nAda,ada@example.com,b-9\n"
    refused = upload(importer, workshop, clash, integration="shop")
    assert refused.status_code == 400
    assert "this integration calls 'a-1'" in refused.context["preview"].rows[0].reasons[0]
    # In the file's own ids (csv) b-9 is new, and names Ada.
    assert upload(importer, workshop, clash, integration="csv").status_code == 200


def test_a_staff_import_changes_the_details_of_any_attendee_and_owns_none_it_creates(
    importer, make_workshop, make_token, make_attendee, client
):
    """Staff may change any attendee's details in the admin, so their import may too, where an
    integration changes only its own; the attendees it creates are no integration's own."""
    from tests.intake.conftest import Api

    workshop = make_workshop(starts_in=timedelta(hours=5))
    shop, lms = (Api(client, make_token(integration=n).secret) for n in ("shop", "lms"))
    shop.post("/api/attendees", {"email": "ada@example.com", "name": "Ada", "external_id": "a-1"})
    lms.post("/api/attendees", {"email": "ada@example.com", "external_id": "l-1"})
    make_attendee(email="grace@example.com", name="Grace")
    data = (
        "name,email,language,timezone,external_id\n"
        "Ada King,ada@example.com,en,,a-1\n"
        "Grace Hopper,grace@example.com,,UTC,g-1\n"
        "Emile Zola,emile@example.com,fr,,e-1\n"
    )
    preview = upload(importer, workshop, data, integration="shop")
    assert [row.outcome for row in preview.context["preview"].rows] == [
        "Existing attendee (details updated), enrolled",
        "Existing attendee (details updated), enrolled",
        "New attendee, enrolled",
    ]
    assert confirm(importer, workshop, preview).status_code == 302
    assert Attendee.objects.get(email="ada@example.com").name == "Ada King"
    assert Attendee.objects.get(email="grace@example.com").timezone == "UTC"
    # The shop's ids name the people the file did, but it created none of them.
    renamed = shop.post("/api/attendees", {"email": "emile@example.com", "name": "E. Zola"})
    assert (renamed.status_code, renamed.json()["outcome"]) == (200, "kept")
    assert Attendee.objects.get(email="emile@example.com").name == "Emile Zola"


def test_staff_enrolling_an_integrations_attendee_leave_them_its_own_until_a_csv_id_names_them(
    importer, make_workshop, make_token, client
):
    """docs/operations.md, "Whose details": the system that created a person keeps their
    address current, whoever enrols them later; staff end that by importing them with an id
    under the csv integration, after which the shop's change of address is refused."""
    from tests.intake.conftest import Api
    from tests.intake.test_api_ownership import refused_as_not_own
    from workshops.services import enrollment_create

    shop = Api(client, make_token(integration="shop").secret)
    shop.post("/api/attendees", {"email": "ada@example.com", "name": "Ada", "external_id": "a-1"})
    ada = Attendee.objects.get()
    enrollment_create(attendee=ada, workshop=make_workshop(starts_in=timedelta(hours=5)))
    moved = shop.post("/api/attendees", {"email": "ada@example.org", "external_id": "a-1"})
    assert (moved.status_code, moved.json()["outcome"]) == (200, "updated")
    workshop = make_workshop(starts_in=timedelta(hours=6))
    preview = upload(importer, workshop, "name,email,external_id\nAda,ada@example.org,c-1\n")
    assert confirm(importer, workshop, preview).status_code == 302
    refused_as_not_own(
        shop.post("/api/attendees", {"email": "ada@example.net", "external_id": "a-1"}), "email"
    )
    ada.refresh_from_db()
    assert ada.email == "ada@example.org"


def test_import_needs_its_permission(staff, make_workshop):
    workshop = make_workshop()
    plain = staff()
    assert upload(plain, workshop, GOOD).status_code == 403
    page = plain.get(f"/admin/workshops/workshop/{workshop.pk}/change/")
    assert b"Import attendees" not in page.content and b"Export attendees" not in page.content
    assert (
        b"Import attendees"
        in staff("import_attendees").get(f"/admin/workshops/workshop/{workshop.pk}/change/").content
    )


def test_the_export_needs_its_own_permission_is_audited_and_escapes_formulas(
    staff, importer, make_workshop
):
    workshop = make_workshop(starts_in=timedelta(hours=5))
    evil = (
        "name,email,external_id\n"
        '"=HYPERLINK(""http://x"")",eq@example.com,+1\n'
        "-minus,minus@example.com,@at\n"
        "Plain,plain@example.com,p-1\n"
    )
    confirm(importer, workshop, upload(importer, workshop, evil))
    url = f"/admin/intake/csvtransfer/export/{workshop.pk}/"
    assert importer.get(url).status_code == 403
    assert CsvTransfer.objects.filter(kind="export").count() == 0
    exporter = staff("export_attendees")
    response = exporter.get(url)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode("utf-8-sig"))))
    by_email = {row["email"]: row for row in rows}
    assert by_email["eq@example.com"]["name"] == '\'=HYPERLINK("http://x")'
    assert by_email["eq@example.com"]["external_id"] == "'+1"
    assert by_email["minus@example.com"]["name"] == "'-minus"
    assert by_email["minus@example.com"]["external_id"] == "'@at"
    assert by_email["plain@example.com"]["name"] == "Plain"
    assert {row["reminder_status"] for row in rows} == {"pending"}
    assert {row["enrolment_status"] for row in rows} == {"active"}
    audit = CsvTransfer.objects.get(kind="export")
    assert audit.rows == 3 and audit.actor_name == "staff-export_attendees"


def test_the_export_runs_no_formula_where_a_semicolon_separates_cells(
    staff, importer, make_workshop
):
    """Excel opens a CSV with the system's list separator, a semicolon in much of Europe (the
    import takes such files): there a ';' in a cell starts a new one, and so does a line break
    in any cell but the first (a quote is special only at a cell's start)."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    evil = 'name,email,external_id\nLee;=1+2;x,lee@example.com,"k;@SUM(1)\n-2+3"\n'
    confirm(importer, workshop, upload(importer, workshop, evil))
    response = staff("export_attendees").get(f"/admin/intake/csvtransfer/export/{workshop.pk}/")
    text = response.content.decode("utf-8-sig")
    as_excel_reads_it = [
        cell for line in csv.reader(io.StringIO(text), delimiter=";") for cell in line
    ]
    assert not [cell for cell in as_excel_reads_it if cell.startswith(("=", "+", "-", "@"))]
    [row] = list(csv.DictReader(io.StringIO(text)))
    assert (row["name"], row["external_id"]) == ("Lee;'=1+2;x", "k;'@SUM(1)\n'-2+3")


def test_a_confirmation_the_data_no_longer_allows_writes_nothing_and_says_why(
    importer, make_workshop
):
    """Previewed, then the workshop is cancelled: the confirmation is refused, the page lists
    each row's reason again, and nothing is written (no 500 from the refused write)."""
    from workshops.services import workshop_cancel

    workshop = make_workshop(starts_in=timedelta(hours=5))
    preview = upload(importer, workshop, GOOD)
    workshop_cancel(workshop=workshop, reason="Teacher ill")
    refused = confirm(importer, workshop, preview)
    assert refused.status_code == 400
    reasons = [row.reasons for row in refused.context["preview"].rows]
    assert all("is cancelled; enrol in a scheduled workshop" in r[0] for r in reasons), reasons
    assert b'id="import-confirm"' not in refused.content
    assert state() == (0, 0, 0, 0) and not CsvTransfer.objects.exists()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xef\xbb\xbf", "The file is empty"),  # Excel's 'CSV UTF-8' of an empty sheet
        (b"\xef\xbb\xbf\r\n;;\r\n", "The file is empty"),
    ],
    ids=["bom-only", "bom-and-blank-rows"],
)
def test_a_file_with_only_a_byte_order_mark_is_refused_as_empty(
    importer, make_workshop, data, says
):
    response = upload(importer, make_workshop(), data)
    assert response.status_code == 400
    assert says in response.context["refusal"], response.context["refusal"]


def test_blank_lines_before_the_header_are_skipped(importer, make_workshop):
    data = "\r\n\r\nname;email\r\nJosé;jose@example.com\r\n".encode()
    preview = upload(importer, make_workshop(), data)
    assert preview.status_code == 200, preview.context.get("refusal")
    rows = preview.context["preview"].rows
    assert [(r.line, r.email) for r in rows] == [(4, "jose@example.com")]


@pytest.mark.parametrize(
    "data",
    [
        # Excel pads every row to the widest one: columns once used, then cleared, stay.
        "name,email,,\r\nAda,ada@example.com,,\r\nGrace,grace@example.com,,\r\n",
        # A trailing separator on rows, not on the header.
        "name;email\nAda;ada@example.com;\nGrace;grace@example.com;;\n",
    ],
    ids=["blank-header-cells", "blank-trailing-cells"],
)
def test_trailing_empty_columns_are_no_data_and_not_refused(importer, make_workshop, data):
    preview = upload(importer, make_workshop(), data)
    assert preview.status_code == 200, preview.context.get("refusal")
    assert [r.email for r in preview.context["preview"].rows] == [
        "ada@example.com",
        "grace@example.com",
    ]


def test_cells_beyond_the_header_that_hold_data_are_still_refused(importer, make_workshop):
    response = upload(importer, make_workshop(), "name,email\nAda,ada@example.com,,x\n")
    assert response.status_code == 400
    assert "Line 2 has 4 cells" in response.context["refusal"]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param("name,,email\nAda,x,ada@example.com\n", id="between"),
        pytest.param("name,email,,\nAda,ada@example.com,,x\n", id="trailing"),
    ],
)
def test_a_value_under_a_column_with_no_name_is_refused_not_dropped(importer, make_workshop, data):
    response = upload(importer, make_workshop(), data)
    assert response.status_code == 400
    refusal = response.context["refusal"]
    assert "Line 2 has a value in a column whose header cell is blank" in refusal


def test_the_preview_names_each_rows_line_in_the_file(importer, make_workshop):
    """Blank lines and a cell with a line break inside it: each row is named by the line
    it starts on, so 'line 7' is the line the organiser finds in the file."""
    data = (
        "name,email,timezone\n"
        "Ada,ada@example.com,\n"
        "\n"
        '"Grace\nHopper",grace@example.com,\n'
        ",,\n"
        " , ,\n"
        "Bad Zone,zone@example.com,Mars/Olympus\n"
    )
    preview = upload(importer, make_workshop(), data)
    assert [(r.line, r.email) for r in preview.context["preview"].rows] == [
        (2, "ada@example.com"),
        (4, "grace@example.com"),
        (8, "zone@example.com"),
    ]


def test_the_confirmation_reads_the_file_as_previewed(importer, make_workshop):
    """The previewed text comes back whole: a tab-separated file whose first column is empty
    starts with a tab, which the form must not strip (the rows would gain a cell)."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    data = "\tname\temail\n\tAda\tada@example.com\n\tGrace\tgrace@example.com\n"
    preview = upload(importer, workshop, data)
    assert preview.status_code == 200, preview.context.get("refusal")
    done = confirm(importer, workshop, preview)
    assert done.status_code == 302, done.context.get("refusal")
    assert Enrollment.objects.filter(workshop=workshop).count() == 2


def test_a_new_attendee_on_two_rows_gets_both_rows_details(importer, make_workshop):
    """Later rows win, as they do for an attendee who already exists; none is dropped."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    data = (
        "name,email,language,timezone\nAda,ada@example.com,en,\nAda,ada@example.com,,Europe/Paris\n"
    )
    confirm(importer, workshop, upload(importer, workshop, data))
    ada = Attendee.objects.get()
    assert (ada.language, ada.timezone) == ("en", "Europe/Paris")
    assert Enrollment.objects.count() == 1


def test_a_cancelled_enrolment_is_explained_for_staff_not_api_clients(
    importer, make_workshop, make_attendee
):
    from workshops.services import enrollment_cancel, enrollment_create

    workshop = make_workshop(starts_in=timedelta(hours=5))
    ada = make_attendee(email="ada@example.com", name="Ada")
    enrollment_cancel(enrollment=enrollment_create(attendee=ada, workshop=workshop))
    preview = upload(importer, workshop, "name,email\nAda,ada@example.com\n")
    assert preview.status_code == 400
    (reason,) = preview.context["preview"].rows[0].reasons
    assert "/api/" not in reason and "POST" not in reason, reason
    assert "back to active on the workshop's page" in reason, reason


def test_the_export_opens_in_excel_with_its_accents(staff, importer, make_workshop):
    """Excel reads a CSV without a byte-order mark as the system's code page: 'Ã‰mile'."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    confirm(importer, workshop, upload(importer, workshop, GOOD))
    exporter = staff("export_attendees")
    response = exporter.get(f"/admin/intake/csvtransfer/export/{workshop.pk}/")
    assert response.content.startswith(codecs.BOM_UTF8)
    rows = list(csv.DictReader(io.StringIO(response.content.decode("utf-8-sig"))))
    assert "Émile Zola" in {row["name"] for row in rows}
    # A hand-edited link with a NUL was a PostgreSQL error, a 500.
    nul = exporter.get(f"/admin/intake/csvtransfer/export/{workshop.pk}/?integration=%00csv")
    assert nul.status_code == 200 and nul.content == response.content


def test_a_language_the_reminders_have_not_is_refused_with_the_ones_they_have(
    importer, make_workshop
):
    preview = upload(importer, make_workshop(), "name,email,language\nAda,ada@example.com,EN\n")
    assert preview.status_code == 400
    (reason,) = preview.context["preview"].rows[0].reasons
    assert reason.startswith("language: ") and "en, de, fr" in reason, reason


def test_an_email_ending_with_a_dot_is_refused_saying_so(importer, make_workshop):
    preview = upload(importer, make_workshop(), "name,email\nAda,ada@example.com.\n")
    assert preview.status_code == 400
    assert preview.context["preview"].rows[0].reasons == [
        "email: The address ends with a dot: remove it."
    ]


def test_a_row_repeating_an_earlier_ones_attendee_is_shown_as_a_repeat(importer, make_workshop):
    """Not 'Already enrolled': the person is new, and the file names them twice."""
    data = "name,email\nAda,ada@example.com\nGrace,grace@example.com\nAda,ADA@example.com\n"
    preview = upload(importer, make_workshop(), data)
    outcomes = [row.outcome for row in preview.context["preview"].rows]
    assert outcomes == [
        "New attendee, enrolled",
        "New attendee, enrolled",
        "Same attendee as an earlier row",
    ]
    done = confirm(importer, preview.context["workshop"], preview)
    (message,) = [str(m) for m in get_messages(done.wsgi_request)]
    assert "3 rows into" in message and ": 2 enrolled, 0 already were, 1 repeated" in message


def test_a_one_row_import_says_row(importer, make_workshop):
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Glazing")
    done = confirm(
        importer, workshop, upload(importer, workshop, "name,email\nAda,a@example.com\n")
    )
    *_, message = [str(m) for m in get_messages(done.wsgi_request)]
    assert message.startswith("Imported 1 row into Glazing: 1 enrolled, 0 already were")


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ("Cy,cy@example.com,c-1\nCy,cy@example.com,c-2\n", "another row of this file"),
        ("Di,di@example.com,d-1\nDee,dee@example.com,d-1\n", "another row of this file"),
        ("Ada,ada@example.org,a-1\nAda,ada@example.com,\n", "keep one row"),
        ("Ada,ada@example.com,z-9\n", "in the external_id column, or leave it blank"),
        ("Eve,eve@example.com,e-1\n", "a new external_id"),
        ("Ada,bob@example.com,a-1\n", "correct the email, or, to mean that attendee, put 'b-1'"),
    ],
    ids=[
        "one-email-two-ids",
        "one-id-two-emails",
        "one-person-two-emails",
        "their-id",
        "erased",
        "email-taken",
    ],
)
def test_a_rows_reason_speaks_of_rows_and_columns_not_an_api_request(
    importer, make_workshop, make_attendee, django_user_model, rows, says
):
    """The preview shows the intake's reasons to staff, who have a file, not a request."""
    from intake.models import Integration
    from reminders.services.erasure import attendees_erase

    csv_ids = Integration.objects.create(name="csv")
    ada, eve = make_attendee(email="ada@example.com"), make_attendee(email="eve@example.com")
    AttendeeRef.objects.create(integration=csv_ids, external_id="a-1", attendee=ada)
    AttendeeRef.objects.create(integration=csv_ids, external_id="e-1", attendee=eve)
    bob = make_attendee(email="bob@example.com")
    AttendeeRef.objects.create(integration=csv_ids, external_id="b-1", attendee=bob)
    staff = django_user_model.objects.create_user("eraser")
    attendees_erase(attendees=Attendee.objects.filter(pk=eve.pk), reason="asked", actor=staff)
    preview = upload(importer, make_workshop(), "name,email,external_id\n" + rows)
    assert preview.status_code == 400
    (reason,) = [r for row in preview.context["preview"].rows for r in row.reasons]
    assert says in reason.lower(), reason
    assert not [w for w in ("this request", "item", "send") if w in reason.lower()], reason


def test_an_exported_file_imports_back_into_its_workshop_and_another_as_it_is(
    staff, make_workshop, make_attendee
):
    """Export, import the bytes unchanged: the export's own columns are read, not refused; a
    row cancelled in the file is enrolled nowhere, and nothing is duplicated or lost."""
    from workshops.services import enrollment_cancel, enrollment_create

    both = staff("import_attendees", "export_attendees")
    workshop = make_workshop(starts_in=timedelta(hours=5), title="Glazing")
    confirm(both, workshop, upload(both, workshop, GOOD))  # Ada a-1, Émile a-2, Grace
    emile = Attendee.objects.get(email="emile@example.com")
    bob = make_attendee(email="bob@example.com", name="Bob")
    enrollment_cancel(enrollment=Enrollment.objects.get(attendee=emile))  # cancelled by staff
    enrollment_cancel(enrollment=enrollment_create(attendee=bob, workshop=workshop))
    exported = both.get(f"/admin/intake/csvtransfer/export/{workshop.pk}/").content
    text = exported.decode("utf-8-sig")
    statuses = {r["email"]: r["enrolment_status"] for r in csv.DictReader(io.StringIO(text))}
    assert statuses == {
        "ada@example.com": "active",
        "bob@example.com": "cancelled",
        "emile@example.com": "cancelled",
        "grace@example.com": "active",
    }
    enrolled = {
        (e.workshop_id, e.attendee.email, e.status)
        for e in Enrollment.objects.select_related("attendee")
    }
    before = state()  # 4 attendees, 4 enrolments (2 cancelled), 4 reminders, refs a-1 and a-2
    skipped = "Not enrolled: cancelled in the file"

    # Into the same workshop: the active rows are already enrolled, the cancelled stay so.
    again = upload(both, workshop, exported, name="workshop-attendees.csv")
    assert again.status_code == 200, again.context.get("refusal")
    preview = again.context["preview"]
    assert [(r.line, r.email, r.outcome) for r in preview.rows] == [
        (2, "ada@example.com", "Already enrolled"),
        (3, "bob@example.com", skipped),
        (4, "emile@example.com", skipped),
        (5, "grace@example.com", "Already enrolled"),
    ]
    assert not preview.invalid and not [r for r in preview.rows if r.reasons]
    page = again.content.decode()
    assert page.count("reminder_status, reminder_status_reason") == 1  # said once: ignored
    assert "enrol them on the workshop's page" in page
    assert 'value="Import 4 rows (2 not enrolled)"' in page  # the button says what it skips
    done = confirm(both, workshop, again)
    assert done.status_code == 302
    *_, message = [str(m) for m in get_messages(done.wsgi_request)]
    assert ": 0 enrolled, 2 already were, 2 not enrolled (cancelled in the file)" in message
    assert state() == before
    assert {
        (e.workshop_id, e.attendee.email, e.status)
        for e in Enrollment.objects.select_related("attendee")
    } == enrolled

    # Into another workshop: the active rows are enrolled there, the cancelled ones are not.
    other = make_workshop(starts_in=timedelta(hours=5), title="Throwing")
    there = upload(both, other, exported)
    assert there.status_code == 200, there.context.get("refusal")
    assert [(r.email, r.outcome) for r in there.context["preview"].rows] == [
        ("ada@example.com", "Existing attendee, enrolled"),
        ("bob@example.com", skipped),
        ("emile@example.com", skipped),
        ("grace@example.com", "Existing attendee, enrolled"),
    ]
    assert confirm(both, other, there).status_code == 302
    assert set(
        Enrollment.objects.filter(workshop=other).values_list("attendee__email", "status")
    ) == {("ada@example.com", "active"), ("grace@example.com", "active")}
    assert state() == (4, 6, 6, 2)  # two enrolments and their reminders; no attendee, no id
    assert set(AttendeeRef.objects.values_list("external_id", "attendee__email")) == {
        ("a-1", "ada@example.com"),
        ("a-2", "emile@example.com"),
    }
    imports = CsvTransfer.objects.filter(kind="import").order_by("pk")
    # The file's rows; those neither created nor unchanged were not enrolled.
    assert [(t.rows, t.created, t.unchanged) for t in imports] == [(3, 3, 0), (4, 0, 2), (4, 2, 0)]


def test_a_column_the_export_does_not_write_is_still_refused(importer, make_workshop):
    """The export's columns are known; a typo of one, or any other column, is not."""
    workshop = make_workshop()
    for header, unknown in [
        ("name,email,enrolment_status,remark", "unknown columns remark"),
        ("name,email,reminder_statuss", "unknown columns reminder_statuss"),
        ("name,email,enrollment_status", "unknown columns enrollment_status"),
    ]:
        response = upload(importer, workshop, f"{header}\nAda,ada@example.com,active\n")
        assert response.status_code == 400
        assert unknown in response.context["refusal"], response.context["refusal"]
    assert state() == (0, 0, 0, 0)


def test_a_row_added_to_an_export_is_enrolled_and_a_status_it_does_not_write_is_refused(
    importer, make_workshop
):
    """A blank enrolment_status (a row added in the spreadsheet) enrols; 'Cancelled' is
    cancelled; a file of cancelled rows alone writes nothing; a misspelt status names its line."""
    workshop = make_workshop(starts_in=timedelta(hours=5))
    header = "name,email,enrolment_status,reminder_status\n"
    added = upload(
        importer, workshop, header + "Ada,ada@example.com,,\nBo,bo@example.com,Cancelled,\n"
    )
    assert [(r.email, r.outcome) for r in added.context["preview"].rows] == [
        ("ada@example.com", "New attendee, enrolled"),
        ("bo@example.com", "Not enrolled: cancelled in the file"),
    ]
    confirm(importer, workshop, added)
    assert state() == (1, 1, 1, 0)
    only = upload(importer, workshop, header + "Cy,cy@example.com,cancelled,sent\n")
    assert only.status_code == 200 and only.context["preview"].skipped == 1
    assert confirm(importer, workshop, only).status_code == 302
    assert state() == (1, 1, 1, 0)
    typo = upload(
        importer, workshop, header + "Ada,ada@example.com,active,\nDi,di@example.com,cancled,\n"
    )
    assert typo.status_code == 400
    assert typo.context["refusal"].startswith("Line 3 has enrolment_status 'cancled'")
    assert state() == (1, 1, 1, 0)


def test_cells_the_export_quoted_against_formulas_import_back_as_they_were(staff, make_workshop):
    """The export puts a ' before a formula start; the import takes it off again, or an id
    '+1' would clash with +1, an address -x@ would be a new attendee and a name would change."""
    both = staff("import_attendees", "export_attendees")
    workshop = make_workshop(starts_in=timedelta(hours=5))
    data = (
        "name,email,external_id\n"
        '"=HYPERLINK(""http://x"")",eq@example.com,+1\n'
        "-minus,-x@example.com,@at\n"
        'Lee;=1+2;x,lee@example.com,"k;@SUM(1)\n-2+3"\n'
    )
    confirm(both, workshop, upload(both, workshop, data))
    before = (state(), set(Attendee.objects.values_list("name", "email")))
    exported = both.get(f"/admin/intake/csvtransfer/export/{workshop.pk}/").content
    assert b"'+1" in exported and b"'-x@example.com" in exported  # still quoted on the way out
    again = upload(both, workshop, exported)
    assert again.status_code == 200, again.context.get("preview") or again.context["refusal"]
    assert {r.outcome for r in again.context["preview"].rows} == {"Already enrolled"}
    confirm(both, workshop, again)
    assert (state(), set(Attendee.objects.values_list("name", "email"))) == before
    assert set(AttendeeRef.objects.values_list("external_id", flat=True)) == {
        "+1",
        "@at",
        "k;@SUM(1)\n-2+3",
    }
