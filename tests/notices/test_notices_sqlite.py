"""Change notices on SQLite, the database of the local run (make run): the claim writes what
was told, the scan numbers a revision and plans a notice, whose claim and record work too."""

from __future__ import annotations

import pytest

from tests.support.processes import run_on_sqlite

SCRIPT = r"""
import json, django
django.setup()
from django.conf import settings
from django.core.management import call_command
call_command("migrate", verbosity=0)
from datetime import timedelta
from clock import FakeClock, SystemClock
from delivery.results import DeliveryResult, Outcome
from reminders.models import Notice, Reminder, WorkshopRevision
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_plan
from reminders.services.notices import notice_claim, notice_record, notices_plan, notices_revise
from workshops.services import attendee_get_or_create, enrollment_create, workshop_create
from workshops.services import workshop_update

settings.REMINDERS_NOTICE_SETTLE = 0
clock = FakeClock(SystemClock().now(), autojump=False)
workshop = workshop_create(title="T", starts_at=clock.now() + timedelta(hours=3),
                           duration=timedelta(hours=1), timezone="UTC", clock=clock,
                           location="Room 1")
attendee, _ = attendee_get_or_create(email="a@example.com", name="A")
enrollment_create(attendee=attendee, workshop=workshop)
reminders_plan(clock=clock)
claim = reminder_claim_batch(ids=list(Reminder.objects.values_list("id", flat=True)),
                             channel="smtp", clock=clock)
told = Reminder.objects.values_list("told_location", flat=True).get()
result = DeliveryResult(reminder_id=claim.reminders[0].pk, key=claim.reminders[0].key,
                        outcome=Outcome.SENT, message_id="m1", error="", attempts=1,
                        provider_reached=True, maybe_delivered=True)
reminder_record_batch(claim=claim, results=[result], clock=clock)
workshop_update(workshop=workshop, location="Room 2")
revised = notices_revise(clock=clock)
planned = notices_plan(clock=clock)
notices = notice_claim(ids=list(Notice.objects.values_list("id", flat=True)), channel="smtp",
                       clock=clock)
notice = notices.notices[0]
counts = notice_record(claim=notices, clock=clock, results=[DeliveryResult(
    reminder_id=notice.pk, key=notice.key, outcome=Outcome.SENT, message_id="n1", error="",
    attempts=1, provider_reached=True, maybe_delivered=True)])
print(json.dumps({"told": [told, Reminder.objects.values_list("told_location", flat=True).get()],
                  "revised": revised, "planned": planned, "counts": counts,
                  "text": notice.text.subject, "again": notices_revise(clock=clock)}))
"""


@pytest.mark.long
@pytest.mark.slow
def test_notices_work_on_sqlite(tmp_path):
    report = run_on_sqlite(SCRIPT, tmp_path)
    assert report["told"] == ["Room 1", "Room 2"]
    assert (report["revised"], report["planned"], report["again"]) == (1, 1, 0)
    assert report["counts"] == {"notices_sent": 1}
    assert report["text"].startswith("Changed: ")
