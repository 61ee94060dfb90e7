"""The API on the local run's SQLite database (make run): a bulk written whole, repeated
unchanged, one bad item refusing all, the reminders planned."""

from __future__ import annotations

import pytest

from tests.support.processes import run_on_sqlite

SCRIPT = r"""
import json, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from datetime import timedelta
from django.test import Client
from clock import SystemClock
from intake.tokens import token_create
from reminders.models import Reminder
from workshops.models import Attendee, Enrollment
from workshops.services import workshop_create

now = SystemClock().now()
workshop = workshop_create(title="T", starts_at=now + timedelta(hours=3),
                           duration=timedelta(hours=1), timezone="UTC")
secret = token_create(integration="shop", name="t", scopes=["enrolments"], created_by="t").secret
client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_HOST="127.0.0.1")
items = [{"workshop": workshop.pk, "attendee": {"email": f"P{i}@Example.com", "name": f"P {i}",
          "external_id": f"p{i}"}} for i in range(50)]
post = lambda body: client.post("/api/enrolments/bulk", json.dumps(body),
                                content_type="application/json")
first, again = post({"items": items}), post({"items": items})
bad = post({"items": items + [{"workshop": workshop.pk, "attendee": {"email": "x", "name": "X"}}]})
print(json.dumps({
    "statuses": [first.status_code, again.status_code, bad.status_code],
    "created": [first.json()["created"], again.json()["created"]],
    "rows": [Attendee.objects.count(), Enrollment.objects.count(), Reminder.objects.count()],
}))
"""


@pytest.mark.long
@pytest.mark.slow
def test_a_bulk_enrolment_works_on_sqlite(tmp_path):
    report = run_on_sqlite(SCRIPT, tmp_path)
    assert report["statuses"] == [200, 200, 422]
    assert report["created"] == [50, 0]
    assert report["rows"] == [50, 50, 50]
