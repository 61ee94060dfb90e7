"""TIME_ZONE is the staff's zone: the admin's "Today" and date drill-down follow it, while the
times the admin labels UTC stay UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django_celery_beat.models import PeriodicTask
from freezegun import freeze_time

from clock import FakeClock
from reminders.schedule import ensure_scan_schedule
from reminders.services import scan_completed
from workshops.services import workshop_create

pytestmark = pytest.mark.django_db

WORKSHOPS = "/admin/workshops/workshop/"
# 23:30 on 6 December in UTC is already 00:30 on 7 December in Berlin.
NOW = datetime(2026, 12, 6, 23, 30, tzinfo=UTC)


def _workshop(title: str, starts_at: datetime):
    return workshop_create(
        title=title,
        starts_at=starts_at,
        duration=timedelta(hours=1),
        timezone="Europe/Berlin",
        clock=FakeClock(NOW - timedelta(days=1)),
    )


def _titles(response) -> set[str]:
    return {workshop.title for workshop in response.context["cl"].result_list}


@pytest.mark.parametrize(
    ("zone", "today"),
    [("Europe/Berlin", {"Saturday night", "Sunday morning"}), ("UTC", {"Saturday night"})],
)
def test_today_among_the_start_filters_is_the_staff_zones_day(admin_client, settings, zone, today):
    settings.TIME_ZONE = zone
    _workshop("Saturday night", datetime(2026, 12, 6, 23, 45, tzinfo=UTC))  # 00:45 on 7 Dec there
    _workshop("Sunday morning", datetime(2026, 12, 7, 9, 0, tzinfo=UTC))
    with freeze_time(NOW):
        changelist = admin_client.get(WORKSHOPS).context["cl"]
        (starts,) = [spec for spec in changelist.filter_specs if spec.title == "starts at"]
        (link,) = [choice for choice in starts.choices(changelist) if choice["display"] == "Today"]
        response = admin_client.get(WORKSHOPS + link["query_string"])
    assert response.status_code == 200
    assert _titles(response) == today


@pytest.mark.parametrize(("zone", "day"), [("Europe/Berlin", "7"), ("UTC", "6")])
def test_the_date_drill_down_files_a_start_under_the_staff_zones_day(
    admin_client, settings, zone, day
):
    settings.TIME_ZONE = zone
    _workshop("Just after midnight", datetime(2026, 12, 6, 23, 15, tzinfo=UTC))
    with freeze_time(NOW):
        response = admin_client.get(
            WORKSHOPS, {"starts_at__year": "2026", "starts_at__month": "12", "starts_at__day": day}
        )
    assert response.status_code == 200
    assert _titles(response) == {"Just after midnight"}


def test_times_labelled_utc_stay_utc_in_another_staff_zone(admin_client, settings, clock):
    settings.TIME_ZONE = "Europe/Berlin"
    task = ensure_scan_schedule()
    PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=clock.now())
    scan_completed(counts={"dispatched": 1}, duration=0.5, worker="w1", clock=clock)
    health = admin_client.get("/admin/reminders/reminder/health/").content.decode()
    changelist = admin_client.get("/admin/reminders/reminder/").content.decode()
    at = clock.now().astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")  # 09:00 UTC, 10:00 in Berlin
    assert health.count(f"{at} UTC") == 3  # the last scan published, the last finished, now
    assert f"{at} UTC" in changelist
