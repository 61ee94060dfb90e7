"""The workshop's start and end are typed in the workshop's zone: its page's date inputs say
nothing of "server time" and their "Today" is today where the workshop is held, in a real
browser whose zone is neither the workshop's nor the server's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.browser.conftest import PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_date_inputs_read_the_workshops_zone_not_the_servers(
    live_server, plain_http_cookies, settings, chromium, make_workshop, django_user_model
):
    settings.TIME_ZONE = "UTC"  # the staff's zone (the server's, to Django's date widget)
    workshop = make_workshop(starts_in=timedelta(days=5), zone="America/Los_Angeles")
    django_user_model.objects.create_superuser(username="organiser", password=PASSWORD)
    context = chromium.new_context(timezone_id="Asia/Tokyo")  # the staff member's browser
    try:
        page = context.new_page()
        # 03:00 UTC: the 2nd in UTC and in Tokyo, still the 1st in Los Angeles.
        page.clock.set_fixed_time(datetime(2030, 3, 2, 3, 0, tzinfo=UTC))
        change = f"/admin/workshops/workshop/{workshop.pk}/change/"
        log_in(page, live_server.url, "organiser", change)
        page.wait_for_selector(".datetimeshortcuts")
        warnings = page.locator(".timezonewarning").all_inner_texts()
        page.locator(".field-starts_at .datetimeshortcuts a", has_text="Today").click()
        typed = page.input_value("#id_starts_at_0")
    finally:
        context.close()
    assert (warnings, typed) == ([], "2030-03-01")
