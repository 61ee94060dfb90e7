"""The django channel's provider reports through django-anymail's tracking webhooks.

Real POSTs to the live server, in the formats Postmark and Mailgun document (written
here as fixtures of this project's own), verified as anymail verifies them: basic auth
for Postmark, which signs nothing, and Mailgun's HMAC signature.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import httpx
import pytest

from reminders.models import DeliveryEvent, Reminder, Suppression

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = ("reminders", "webhook-password-0a1b2c3d4e5f6a7b8c9d")
MAILGUN_KEY = "mailgun-signing-key-0a1b2c3d4e5f6a7b8c9d"


@pytest.fixture
def sent(due_reminders, settings):
    settings.ANYMAIL_WEBHOOK_SECRET = ":".join(AUTH)
    settings.ANYMAIL_MAILGUN_WEBHOOK_SIGNING_KEY = MAILGUN_KEY
    ids = due_reminders(3)
    Reminder.objects.filter(pk__in=ids).update(status="sent")
    for reminder in Reminder.objects.filter(pk__in=ids).select_related("attendee"):
        # What the claim records of its message.
        Reminder.objects.filter(pk=reminder.pk).update(sent_to=reminder.attendee.email)
    return list(Reminder.objects.filter(pk__in=ids).order_by("pk").select_related("attendee"))


def _postmark_bounce(reminder, *, kind="HardBounce", bounce_id=4323372036854775807):
    return {
        "RecordType": "Bounce", "ID": bounce_id, "Type": kind, "TypeCode": 1,
        "Name": "Hard bounce", "Tag": "", "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
        "Metadata": {"reminder_key": reminder.key}, "ServerID": 23, "MessageStream": "outbound",
        "Description": "The server was unable to deliver your message.",
        "Details": f"smtp;550 5.1.1 <{reminder.attendee.email}>: mailbox not found",
        "Email": reminder.attendee.email, "From": "reminders@example.org",
        "BouncedAt": "2026-12-04T10:00:00Z", "DumpAvailable": True, "Inactive": True,
        "CanActivate": True, "Subject": "Reminder",
    }  # fmt: skip


def _postmark_delivery(reminder):
    return {
        "RecordType": "Delivery", "ServerID": 23, "MessageStream": "outbound",
        "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483", "Recipient": reminder.attendee.email,
        "Tag": "", "DeliveredAt": "2026-12-04T10:00:00Z", "Details": "250 2.0.0 OK",
        "Metadata": {"reminder_key": reminder.key},
    }  # fmt: skip


def _mailgun(reminder, *, event="failed", severity="permanent", token="a8ce0edb2dd8301dee6c24"):
    timestamp = "1764842400"
    signature = hmac.new(MAILGUN_KEY.encode(), f"{timestamp}{token}".encode(), hashlib.sha256)
    return {
        "signature": {"timestamp": timestamp, "token": token, "signature": signature.hexdigest()},
        "event-data": {
            "event": event, "severity": severity, "timestamp": 1764842400.25,
            "id": "G9Bn5sl1TC6nu79C8C0bwg", "recipient": reminder.attendee.email,
            "reason": "bounce", "user-variables": {"reminder_key": reminder.key},
            "delivery-status": {"code": 550, "message": "No Such User Here", "description": ""},
            "message": {"headers": {"message-id": "20261204100000.1.ABC@example.org"}},
        },
    }  # fmt: skip


def _post(live_server, esp: str, payload, *, auth=AUTH):
    return httpx.post(
        f"{live_server.url}/anymail/{esp}/tracking/",
        json=payload,
        auth=auth,
        timeout=10,
    )


def test_a_postmark_hard_bounce_is_kept_once_and_suppresses_the_address(sent, live_server):
    first = sent[0]
    for _ in range(2):  # Postmark retries a webhook it thinks failed
        assert _post(live_server, "postmark", _postmark_bounce(first)).status_code == 200
    report = DeliveryEvent.objects.get()
    assert (report.reminder_id, report.channel, report.kind, report.bounce) == (
        first.pk, "django", "bounced", "hard",
    )  # fmt: skip
    assert report.event_id == "postmark:4323372036854775807"
    assert "mailbox not found" in report.reason
    suppression = Suppression.objects.get()
    assert suppression.address == first.attendee.email
    assert suppression.event == report  # the report that caused it


def test_a_postmark_delivery_without_an_id_is_kept_once_and_a_soft_bounce_is_soft(
    sent, live_server
):
    for _ in range(2):
        assert _post(live_server, "postmark", _postmark_delivery(sent[0])).status_code == 200
    soft = _postmark_bounce(sent[1], kind="SoftBounce", bounce_id=7)
    assert _post(live_server, "postmark", soft).status_code == 200
    kept = sorted(DeliveryEvent.objects.values_list("reminder_id", "kind", "bounce"))
    assert kept == [(sent[0].pk, "delivered", ""), (sent[1].pk, "bounced", "soft")]
    assert not Suppression.objects.exists()


def test_a_signed_mailgun_failure_is_a_hard_bounce_and_a_temporary_one_is_deferred(
    sent, live_server
):
    assert _post(live_server, "mailgun", _mailgun(sent[0])).status_code == 200
    later = _mailgun(sent[1], severity="temporary", token="b9df1")
    assert _post(live_server, "mailgun", later).status_code == 200
    kept = sorted(DeliveryEvent.objects.values_list("reminder_id", "kind", "bounce", "event_id"))
    assert kept == [
        (sent[0].pk, "bounced", "hard", "mailgun:a8ce0edb2dd8301dee6c24"),
        (sent[1].pk, "deferred", "", "mailgun:b9df1"),
    ]


@pytest.mark.parametrize(
    "esp, forged",
    [
        ("postmark", lambda r: (_postmark_bounce(r), ("reminders", "wrong"))),
        ("postmark", lambda r: (_postmark_bounce(r), None)),
        ("mailgun", lambda r: ({**_mailgun(r), "signature": {**_mailgun(r)["signature"],
                                "signature": "0" * 64}}, AUTH)),
        ("mailgun", lambda r: (_mailgun(r), ("reminders", "wrong"))),
    ],
    ids=["postmark-wrong-password", "postmark-no-auth", "mailgun-bad-signature",
         "mailgun-wrong-password"],
)  # fmt: skip
def test_a_report_without_the_providers_proof_is_refused_and_changes_nothing(
    sent, live_server, esp, forged
):
    payload, auth = forged(sent[0])
    answer = _post(live_server, esp, payload, auth=auth)
    assert 400 <= answer.status_code < 500
    assert not DeliveryEvent.objects.exists() and not Suppression.objects.exists()


def test_without_a_webhook_secret_no_report_is_kept(sent, live_server, settings):
    settings.ANYMAIL_WEBHOOK_SECRET = ""
    _post(live_server, "postmark", _postmark_bounce(sent[0]), auth=None)
    assert not DeliveryEvent.objects.exists() and not Suppression.objects.exists()


def test_the_django_channel_sends_the_key_and_records_the_providers_id(settings, mailoutbox):
    from clock import SystemClock
    from reminders.worker.bridge import send_with_django
    from tests.delivery.conftest import envelope_factory

    settings.EMAIL_BACKEND = "anymail.backends.test.EmailBackend"
    envelope = envelope_factory(SystemClock())()
    provider_id = send_with_django(envelope)
    [message] = mailoutbox
    assert message.metadata == {"reminder_key": envelope.key}
    assert provider_id == str(message.anymail_status.message_id)


def test_a_report_whose_ids_hold_a_nul_or_a_lone_surrogate_is_kept_or_dropped_not_a_500(
    sent, live_server
):
    """PostgreSQL stores no NUL and UTF-8 no lone surrogate (JSON's "\\ud800"): such an event
    id was a 500 the provider retries for days. Now an id is kept by its digest, a key no
    message has is dropped, and the report of a real key is kept once, however often sent."""
    odd_id = _mailgun(sent[0])
    odd_id["event-data"]["id"] = "G9Bn\x00\ud800"
    odd_key = _mailgun(sent[1], token="b8ce0edb2dd8301dee6c25")
    odd_key["event-data"]["user-variables"]["reminder_key"] = sent[1].key + "\x00"
    for payload in (odd_id, odd_id, odd_key):
        answer = httpx.post(
            f"{live_server.url}/anymail/mailgun/tracking/",
            content=json.dumps(payload).encode(),  # "\ud800" escaped, as a provider writes it
            headers={"Content-Type": "application/json"},
            auth=AUTH,
            timeout=10,
        )
        assert answer.status_code == 200
    kept = list(DeliveryEvent.objects.values_list("reminder_id", "kind", "event_id"))
    assert [(reminder, kind) for reminder, kind, _ in kept] == [(sent[0].pk, "bounced")]
    assert kept[0][2].startswith("mailgun:") and "\x00" not in kept[0][2]
