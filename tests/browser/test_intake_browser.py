"""The ways in, in a real browser: staff import a CSV (preview, confirm) and make an API
token that the API then accepts."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from intake.models import CsvTransfer
from reminders.models import Reminder
from tests.browser.conftest import PASSWORD, log_in
from workshops.models import Enrollment

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.django_db(transaction=True),
]

CSV = "name;email;language\nAda Lovelace;ada@example.com;en\nÉmile Zola;emile@example.com;fr\n"


def test_staff_import_a_csv_see_each_row_then_confirm(
    live_server, plain_http_cookies, make_workshop, new_page, screenshot_dir, admin_user, tmp_path
):
    workshop = make_workshop(title="Glazing", starts_in=timedelta(hours=5))
    admin_user.set_password(PASSWORD)
    admin_user.save()
    broken = tmp_path / "broken.csv"
    broken.write_bytes((CSV + "No Mail;;de\n").encode())
    good = tmp_path / "attendees.csv"
    good.write_bytes(CSV.encode())

    page = new_page()
    log_in(
        page,
        live_server.url,
        admin_user.username,
        f"/admin/workshops/workshop/{workshop.pk}/change/",
    )
    page.get_by_role("link", name="Import attendees (CSV)").click()
    page.set_input_files("#id_file", str(broken))
    page.get_by_role("button", name="Preview").click()
    assert "1 row cannot be imported" in page.locator("#import-blocked").inner_text()
    assert "email: This field cannot be blank." in page.locator("#import-preview").inner_text()
    assert page.locator("#import-confirm").count() == 0

    page.set_input_files("#id_file", str(good))
    page.get_by_role("button", name="Preview").click()
    table = page.locator("#import-preview").inner_text()
    assert table.count("New attendee, enrolled") == 2 and "Émile Zola" in table
    assert Enrollment.objects.count() == 0
    page.screenshot(path=screenshot_dir / "csv-import-preview.png", full_page=True)
    page.get_by_role("button", name="Import 2 rows").click()
    page.wait_for_url(f"**/admin/workshops/workshop/{workshop.pk}/change/")
    assert "Imported 2 rows into Glazing: 2 enrolled" in page.locator(".messagelist").inner_text()
    assert Enrollment.objects.filter(workshop=workshop).count() == 2
    assert Reminder.objects.filter(workshop=workshop, status="pending").count() == 2
    assert CsvTransfer.objects.get().created == 2


def test_staff_make_a_token_see_it_once_and_the_api_takes_it_until_revoked(
    live_server, plain_http_cookies, new_page, admin_user
):
    import httpx

    admin_user.set_password(PASSWORD)
    admin_user.save()
    page = new_page()
    log_in(page, live_server.url, admin_user.username, "/admin/intake/apitoken/add/")
    page.fill("#id_integration_name", "shop")
    page.fill("#id_name", "production")
    page.get_by_role("button", name="Save", exact=True).click()
    secret = page.locator("#api-token").inner_text().strip()
    assert secret.startswith("wr_")
    assert "shown once" in page.locator("#content").inner_text()

    headers = {"Authorization": f"Bearer {secret}"}
    answer = httpx.get(f"{live_server.url}/api/enrolments", headers=headers)
    assert answer.status_code == 200 and json.loads(answer.text)["items"] == []

    page.goto(f"{live_server.url}/admin/intake/apitoken/")
    assert secret not in page.content()  # listed by its prefix only
    page.locator("input[name=_selected_action]").first.check()
    page.select_option("select[name=action]", "revoke_selected")
    page.get_by_role("button", name="Go").click()
    assert "Revoked 1 token" in page.locator(".messagelist").inner_text()
    assert httpx.get(f"{live_server.url}/api/enrolments", headers=headers).status_code == 401
