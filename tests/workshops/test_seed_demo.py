"""seed_demo builds the realistic data set the README promises, and is safe to run twice."""

import pytest
from django.core.management import call_command

from reminders.models import Reminder
from workshops.models import Attendee, Enrollment, Workshop, WorkshopText

pytestmark = pytest.mark.django_db


def test_seed_demo_builds_every_case_once(clock, capsys):
    call_command("seed_demo", "--password", "demo-pass-123")
    call_command("seed_demo")
    workshops = Workshop.objects.all()
    assert workshops.count() == 7
    assert len({w.timezone for w in workshops}) >= 5
    assert workshops.filter(status="cancelled").count() == 1
    assert Enrollment.objects.filter(status="cancelled").count() == 1
    statuses = dict(
        (status, Reminder.objects.filter(status=status).count())
        for status in ("pending", "missed", "cancelled")
    )
    assert statuses["missed"] > 0  # the workshop inside the cutoff
    assert statuses["cancelled"] > 0
    assert statuses["pending"] > 0
    # Staff texts and languages have something to show (docs/staff.md).
    assert set(Attendee.objects.exclude(language="").values_list("language", flat=True)) == {
        "de",
        "fr",
    }
    (text,) = WorkshopText.objects.all()
    assert text.language == "de" and text.workshop.reminder_intro
    text.workshop.full_clean()
    text.full_clean()
    out = capsys.readouterr().out
    assert "user: staff  password: demo-pass-123" in out
    assert "already exist" in out
