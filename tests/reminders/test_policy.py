"""The one deadline rule, computed from the absolute start, right across DST transitions (T5)."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from reminders.policy import ReminderPolicy

POLICY = ReminderPolicy(lead=timedelta(hours=24), cutoff=timedelta(minutes=30))


@pytest.mark.parametrize(
    ("zone", "local_start", "expected_deadline_utc"),
    [
        # Berlin springs forward at 02:00 on 2026-03-29: 09:00 CEST is 07:00 UTC.
        ("Europe/Berlin", datetime(2026, 3, 29, 9, 0), datetime(2026, 3, 29, 6, 30, tzinfo=UTC)),
        # Berlin falls back on 2026-10-25: 09:00 CET is 08:00 UTC.
        ("Europe/Berlin", datetime(2026, 10, 25, 9, 0), datetime(2026, 10, 25, 7, 30, tzinfo=UTC)),
        # New York springs forward on 2026-03-08: 09:00 EDT is 13:00 UTC.
        ("America/New_York", datetime(2026, 3, 8, 9, 0), datetime(2026, 3, 8, 12, 30, tzinfo=UTC)),
        # A 02:45 start just after the New York jump: the cutoff lands before the gap.
        ("America/New_York", datetime(2026, 3, 8, 3, 15), datetime(2026, 3, 8, 6, 45, tzinfo=UTC)),
    ],
)
def test_deadline_is_thirty_real_minutes_before_start_on_dst_days(
    zone, local_start, expected_deadline_utc
):
    starts_at = local_start.replace(tzinfo=ZoneInfo(zone))
    assert POLICY.deadline_at(starts_at).astimezone(UTC) == expected_deadline_utc
    assert starts_at - POLICY.deadline_at(starts_at) == timedelta(minutes=30)


def test_window_spans_a_dst_night_as_elapsed_hours_not_wall_hours():
    """24 hours before 09:00 CEST on the spring-forward day is 08:00 CET the day before."""
    starts_at = datetime(2026, 3, 29, 9, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    opens = POLICY.window_opens_at(starts_at).astimezone(ZoneInfo("Europe/Berlin"))
    assert opens == datetime(2026, 3, 28, 8, 0, tzinfo=ZoneInfo("Europe/Berlin"))


def test_naive_start_is_refused():
    with pytest.raises(ValueError, match="aware"):
        POLICY.deadline_at(datetime(2026, 3, 29, 9, 0))


def test_lead_must_exceed_cutoff():
    with pytest.raises(ValueError, match="lead must be longer"):
        ReminderPolicy(lead=timedelta(minutes=30), cutoff=timedelta(minutes=30))


@pytest.mark.django_db
def test_every_form_of_the_late_rule_agrees_at_the_boundary(clock, make_workshop, enrol):
    """is_late, late_start_q/open_start_q and late_sql/open_sql (all on the workshop's start,
    which is all a decision reads) give one answer a microsecond before, at, and a
    microsecond after the deadline."""
    from reminders.models import Reminder
    from workshops.models import Workshop

    workshop = make_workshop(starts_in=timedelta(hours=2))
    enrol(workshop)
    reminder = Reminder.objects.get()
    policy = ReminderPolicy.from_settings()
    tick = timedelta(microseconds=1)
    for now, late in [
        (reminder.deadline_at - tick, False),
        (reminder.deadline_at, True),
        (reminder.deadline_at + tick, True),
    ]:

        def literal(delta, now=now):  # the statement's "now" as a FakeClock hands it over
            return "%s", [now + delta]

        forms = {
            "is_late": policy.is_late(deadline_at=reminder.deadline_at, now=now),
            "late_start_q": Reminder.objects.filter(
                policy.late_start_q(now, through="workshop__")
            ).exists(),
            "not open_start_q": not Reminder.objects.filter(
                policy.open_start_q(now, through="workshop__")
            ).exists(),
            "late_sql": _exists_where(Workshop, *policy.late_sql("starts_at", literal)),
            "not open_sql": not _exists_where(Workshop, *policy.open_sql("starts_at", literal)),
        }
        assert forms == dict.fromkeys(forms, late), (now, forms)


def _exists_where(model, where: str, params: list) -> bool:
    from django.db import connection

    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {where})", params)
        return bool(cursor.fetchone()[0])
