"""Migration 0025 fills in what reminders sent before change notices told: the workshop's
facts at the upgrade (their messages were never stored)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.migrations import migrate_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [
    ("reminders", "0024_change_notices"),
    ("workshops", "0007_notice_intro_and_cancellation_reason"),
]
AFTER = [("reminders", "0025_told_facts_backfill")]


def test_sent_and_unknown_reminders_take_the_workshops_facts_at_the_upgrade(back_to_latest):
    apps = migrate_to(BEFORE)
    Workshop = apps.get_model("workshops", "Workshop")
    Attendee = apps.get_model("workshops", "Attendee")
    Enrollment = apps.get_model("workshops", "Enrollment")
    Reminder = apps.get_model("reminders", "Reminder")
    start = datetime(2030, 1, 1, 10, tzinfo=UTC)
    workshop = Workshop.objects.create(
        title="T", starts_at=start, ends_at=start + timedelta(hours=1), timezone="UTC",
        location="Room 1", join_url="https://meet.example.com/a",
    )  # fmt: skip
    rows = {}
    for i, status in enumerate(("sent", "unknown", "pending")):
        attendee = Attendee.objects.create(name=f"A{i}", email=f"a{i}@example.com")
        enrollment = Enrollment.objects.create(attendee=attendee, workshop=workshop)
        rows[status] = Reminder.objects.create(
            attendee=attendee, workshop=workshop, enrollment=enrollment, key=f"k{i}",
            status=status,
        ).pk  # fmt: skip
    apps = migrate_to(AFTER)
    Reminder = apps.get_model("reminders", "Reminder")
    told = {
        status: Reminder.objects.values_list(
            "told_starts_at", "told_ends_at", "told_location", "told_join_url", "told_cancelled"
        ).get(pk=pk)
        for status, pk in rows.items()
    }
    facts = (start, start + timedelta(hours=1), "Room 1", "https://meet.example.com/a", False)
    assert told == {"sent": facts, "unknown": facts, "pending": (None, None, "", "", False)}
