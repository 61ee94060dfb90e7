"""Log lines about a reminder carry its id, key, claim token, worker and attempt number
(issue 13, item 2), read back against the DeliveryAttempt the claim wrote."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.conf import settings as django_settings

from config.reporting import JsonLines
from reminders.models import DeliveryAttempt, Reminder
from reminders.worker.logcontext import ReminderFields

pytestmark = pytest.mark.django_db(transaction=True)


def _json_handler() -> tuple[logging.Handler, io.StringIO]:
    """A handler built as config/settings.py builds the console one, writing to a buffer."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ReminderFields())
    json_format = django_settings.LOGGING["formatters"]["json"]
    handler.setFormatter(
        JsonLines(
            json_format["fmt"],
            rename_fields=json_format["rename_fields"],
            timestamp=json_format["timestamp"],
        )
    )
    return handler, stream


def test_the_console_handler_adds_the_reminder_fields():
    logging_config = django_settings.LOGGING
    assert "reminder" in logging_config["handlers"]["console"]["filters"]
    assert (
        logging_config["filters"]["reminder"]["()"] == "reminders.worker.logcontext.ReminderFields"
    )


def test_a_failed_send_is_logged_with_its_reminder_claim_worker_and_attempt(
    live_clock, due_reminders, settings
):
    from loopback.http_sink import HttpSink
    from reminders.worker import pipeline

    settings.REMINDERS_RATE_LIMIT = 0
    ids = due_reminders(3, per_workshop=3)
    keys = dict(Reminder.objects.filter(pk__in=ids).values_list("pk", "key"))
    refused = ids[1]
    # An earlier, released claim, so the attempt number (2) is not the claim counter (1).
    from reminders.services import reminder_claim_batch, reminder_release

    earlier = reminder_claim_batch(ids=[refused], channel="http", clock=live_clock)
    reminder_release(claim=earlier, clock=live_clock)
    handler, stream = _json_handler()
    engine = logging.getLogger("delivery")
    engine.addHandler(handler)
    try:
        with HttpSink() as sink:
            settings.REMINDERS_HTTP_URL = sink.url
            settings.REMINDERS_HTTP_SECRET = "s3cret"
            sink.script(keys[refused], 422)
            counts = pipeline.deliver(ids, clock=live_clock, channel="http", worker="w7@host")
    finally:
        engine.removeHandler(handler)
    assert counts == {"skipped": 0, "sent": 2, "failed": 1}
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [line] = [line for line in lines if line.get("reminder_id") == refused]
    attempt = DeliveryAttempt.objects.get(reminder_id=refused, worker="w7@host")
    assert attempt.number == 2
    assert line["level"] == "WARNING"
    assert line["key"] == keys[refused]
    assert line["claim_token"] == str(attempt.claim_token)
    assert line["worker"] == "w7@host"
    assert line["attempt"] == 2
