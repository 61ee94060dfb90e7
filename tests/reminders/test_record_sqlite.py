"""The record's and the claim watch's hand-written SQL, and the claim's freezing of texts,
also run on SQLite, the database of the local run (make run)."""

from __future__ import annotations

import pytest

from tests.support.processes import run_on_sqlite

SCRIPT = r"""
import json, os, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from datetime import timedelta
from clock import FakeClock, SystemClock
from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryAttempt, Reminder
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_plan
from workshops.services import attendee_get_or_create, enrollment_create, workshop_create

clock = FakeClock(SystemClock().now(), autojump=False)
workshop = workshop_create(title="T", starts_at=clock.now() + timedelta(hours=3),
                           duration=timedelta(hours=1), timezone="UTC", clock=clock)
for i in range(3):
    attendee, _ = attendee_get_or_create(email=f"a{i}@example.com", name=f"A {i}")
    enrollment_create(attendee=attendee, workshop=workshop)
reminders_plan(clock=clock)
claim = reminder_claim_batch(ids=list(Reminder.objects.values_list("id", flat=True)),
                             channel="smtp", clock=clock)
def values(obj):
    return obj and [getattr(obj, f.attname) for f in obj._meta.concrete_fields]
def part(obj, name):
    return obj if name == "self" else getattr(obj, name)
orm = {r.pk: r for r in Reminder.objects.select_related("attendee", "workshop", "text")}
loaded = [[values(part(r, name)) == values(part(orm[r.pk], name))
           for name in ("self", "attendee", "workshop", "text")] for r in claim.reminders]
from reminders.services.watch import ClaimWatch
from workshops.services import workshop_update
watch = ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock)
watch.refresh()
as_rendered = [watch.gate.withdrawn(r.pk) for r in claim.reminders]
later = workshop.starts_at + timedelta(hours=1)
workshop_update(workshop=workshop, starts_at=later, ends_at=later + timedelta(hours=1))
watch.refresh()
after_move = [watch.gate.withdrawn(r.pk) for r in claim.reminders]
outcomes = [Outcome.SENT, Outcome.PERMANENT, Outcome.TRANSIENT]
results = [
    DeliveryResult(reminder_id=r.pk, key=r.key, outcome=o, message_id="m1" if o == Outcome.SENT
                   else None, error="" if o == Outcome.SENT else "550 it's 'quoted'",
                   attempts=1, provider_reached=True, maybe_delivered=o == Outcome.SENT)
    for r, o in zip(claim.reminders, outcomes)
]
counts = reminder_record_batch(claim=claim, results=results, clock=clock)
rows = [[r.status, r.last_error, r.sent_at == clock.now(), r.provider_message_id,
         r.claim_token is None] for r in Reminder.objects.order_by("id")]
attempts = [[a.outcome, a.error, a.finished_at == clock.now(), a.provider_calls]
            for a in DeliveryAttempt.objects.order_by("id")]
frozen = sorted(set(Reminder.objects.values_list("text_id", flat=True)))
print(json.dumps({"counts": counts, "rows": rows, "attempts": attempts,
                  "watch": [as_rendered, after_move], "loaded": loaded, "frozen": [frozen, [r.text_id for r in
                  claim.reminders]]}))
"""


@pytest.mark.long
@pytest.mark.slow
def test_the_claim_watch_and_the_record_work_on_sqlite(tmp_path):
    report = run_on_sqlite(SCRIPT, tmp_path)
    # The claim's rows, read by hand-written SQL, are what select_related reads (own
    # fields, attendee, workshop, frozen text), SQLite's converters applied.
    assert report["loaded"] == [[True] * 4] * 3
    changed = "workshop changed after the message was rendered"
    assert report["watch"] == [[None, None, None], [changed, changed, changed]]
    # The claim froze one shared text on SQLite too (its insert-or-read path).
    (text_ids,), claimed_texts = report["frozen"][0], report["frozen"][1]
    assert text_ids is not None and claimed_texts == [text_ids] * 3
    # Moved later: the handed-back one is pending with the new deadline.
    assert report["counts"] == {"sent": 1, "failed": 1, "pending": 1}
    assert report["rows"] == [
        ["sent", "", True, "m1", True],
        ["failed", "550 it's 'quoted'", False, "", True],
        ["pending", "550 it's 'quoted'", False, "", True],
    ]
    assert report["attempts"] == [
        ["sent", "", True, 1],
        ["permanent", "550 it's 'quoted'", True, 1],
        ["transient", "550 it's 'quoted'", True, 1],
    ]
