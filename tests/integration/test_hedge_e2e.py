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
from reminders import pipeline
from reminders.models import Reminder

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

_real = SystemClock()


def test_the_first_endpoint_to_accept_wins_and_is_recorded(
    live_clock, make_workshop, enrol, settings
):
    enrol(make_workshop(starts_in=timedelta(hours=3)), count=5)
    ids = list(Reminder.objects.values_list("id", flat=True))
    with HttpSink(secret="s3cret", delay=3.0) as slow, HttpSink(secret="s3cret") as fast:
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL = slow.url
        settings.REMINDERS_HTTP_SECRET = "s3cret"
        settings.REMINDERS_HTTP_HEDGE_URLS = [fast.url]
        settings.REMINDERS_HTTP_HEDGE_STAGGER = 0.2
        began = _real.monotonic()
        counts = pipeline.deliver(ids, clock=_real, channel="http")
        took = _real.monotonic() - began
        fast_stats = fast.stats()
    assert counts["sent"] == 5
    assert took < 2.0, f"waited for the slow endpoint ({took:.1f} s)"
    assert fast_stats["accepted"] == 5 and fast_stats["bad_signatures"] == 0
    rows = list(Reminder.objects.values_list("status", "provider_message_id"))
    assert {status for status, _ in rows} == {"sent"}
    assert all(message_id.startswith("sink-") for _, message_id in rows)


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
