"""REMINDERS_HTTP_HEDGE_URLS end to end: a slow primary endpoint, a fast second one.

Claim, render, sign and send through the pipeline with the settings an
operator sets, against two real HTTP endpoints on loopback: the first
acceptance wins, its message id is recorded, the reminder is sent once.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from clock import SystemClock
from loopback.http_sink import HttpSink
from reminders.models import Reminder
from reminders.worker import pipeline

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

_real = SystemClock()


def test_the_first_endpoint_to_accept_wins_and_is_recorded(
    live_clock, make_workshop, enrol, settings
):
    enrol(make_workshop(starts_in=timedelta(hours=3)), count=5)
    ids = list(Reminder.objects.values_list("id", flat=True))
    with (
        HttpSink(secret="s3cret", delay=3.0, id_prefix="slow") as slow,
        HttpSink(secret="s3cret", id_prefix="fast") as fast,
    ):
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL = slow.url
        settings.REMINDERS_HTTP_SECRET = "s3cret"
        settings.REMINDERS_HTTP_HEDGE_URLS = [fast.url]
        settings.REMINDERS_HTTP_HEDGE_STAGGER = 0.2
        counts = pipeline.deliver(ids, clock=_real, channel="http")
        fast_ids = {r.key: r.message_id for r in fast.requests if r.status == 200}
        slow_answered = [r for r in slow.requests if r.status == 200]
    assert counts["sent"] == 5
    assert len(fast_ids) == 5
    # The fast endpoint's acceptance is what was recorded, for every reminder.
    rows = dict(Reminder.objects.values_list("key", "provider_message_id"))
    assert rows == fast_ids
    assert all(message_id.startswith("fast-") for message_id in rows.values())
    assert set(Reminder.objects.values_list("status", flat=True)) == {"sent"}
    print(f"\nhedge: fast accepted {len(fast_ids)}, slow answered {len(slow_answered)}")


def test_a_hedge_url_that_is_not_http_stops_start_up_with_the_variable_named():
    import subprocess
    import sys

    from tests.support.processes import process_env

    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=process_env(REMINDERS_HTTP_HEDGE_URLS="ftp://elsewhere/x"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "REMINDERS_HTTP_HEDGE_URLS must list http(s) URLs" in result.stderr
