"""The e2e benchmark's baseline: one Celery task per reminder, a blocking client (HTTP or SMTP).

Loaded only by the baseline workers of ``bench/e2e.py``::

    celery -A config worker -I bench.e2e_baseline -Q baseline

so the product's tasks and routes are untouched. This is the design the
project replaces, done carefully: each task loads its reminder with one
query, renders it with the product's own templates, posts it with a
module-level ``httpx.Client`` (one kept-alive connection per pool process)
signed as ``delivery/HTTP_CONTRACT.md`` says, or builds the product's own
email and sends it over a kept-alive ``smtplib.SMTP`` connection, and writes the provider's
message id back with one UPDATE (no status change: statuses belong to
reminders.services). Celery's own per-task ``rate_limit`` throttles it:
a token bucket per worker process, not shared between workers, so the
driver sets it to the provider's limit divided by the number of workers
(``BENCH_BASELINE_RATE``).
"""

from __future__ import annotations

import os
import smtplib

import httpx
from celery import shared_task
from django.conf import settings

from clock import default_clock
from delivery.channels.http import encode_body, signed_headers
from delivery.message import message_id_for, parse_sender, write_message
from reminders.content import reminder_envelope
from reminders.models import Reminder

RATE = os.environ.get("BENCH_BASELINE_RATE", "100/s") or None  # empty: unthrottled
_client: httpx.Client | None = None
_smtp: smtplib.SMTP | None = None


def _http() -> httpx.Client:
    global _client
    if _client is None:
        _client = httpx.Client(timeout=settings.REMINDERS_CALL_TIMEOUT)
    return _client


def _mail() -> smtplib.SMTP:
    global _smtp
    if _smtp is None:
        _smtp = smtplib.SMTP(settings.EMAIL_HOST, settings.EMAIL_PORT, timeout=10)
    return _smtp


def _envelope(reminder_id: int):
    """Load one reminder with one query and render it with the product's own templates."""
    reminder = Reminder.objects.select_related("attendee", "workshop").get(pk=reminder_id)
    return reminder_envelope(reminder=reminder)


def _store(reminder_id: int, message_id: str) -> str:
    Reminder.objects.filter(pk=reminder_id).update(provider_message_id=message_id[:255])
    return message_id


@shared_task(name="bench.baseline_send_smtp", rate_limit=RATE, ignore_result=True)
def baseline_send_smtp(reminder_id: int) -> str:
    """Deliver one reminder over SMTP, blocking, and store its Message-ID."""
    clock = default_clock()
    envelope = _envelope(reminder_id)
    sender = parse_sender(settings.DEFAULT_FROM_EMAIL, setting="DEFAULT_FROM_EMAIL")
    message = write_message(envelope, sender=sender, date=clock.now())
    _mail().sendmail(sender.address, [message.recipient], message.data)
    return _store(reminder_id, message_id_for(envelope.key, sender.domain))


@shared_task(name="bench.baseline_send_http", rate_limit=RATE, ignore_result=True)
def baseline_send_http(reminder_id: int) -> str:
    """Deliver one reminder over HTTP, blocking, and store the provider's message id."""
    clock = default_clock()
    envelope = _envelope(reminder_id)
    body = encode_body(envelope)
    timestamp = str(int(clock.now().timestamp()))
    response = _http().post(
        settings.REMINDERS_HTTP_URL,
        content=body,
        headers=signed_headers(
            secret=settings.REMINDERS_HTTP_SECRET, key=envelope.key, body=body, timestamp=timestamp
        ),
    )
    response.raise_for_status()
    return _store(reminder_id, response.json().get("message_id", ""))
