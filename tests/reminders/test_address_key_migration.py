"""Migration 0035 keys suppressions and reports again by one spelling of each address: a
domain in punycode names the mailbox its Unicode form names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils.crypto import salted_hmac

from reminders.services.feedback import address_key
from tests.support.migrations import migrate_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [
    ("reminders", "0034_notice_claimed_while_sending"),
    ("workshops", "0007_notice_intro_and_cancellation_reason"),
]
AFTER = [("reminders", "0035_address_key_one_spelling")]


def _old_key(email: str) -> str:
    """The key before 0035: the address in lower case, its domain as written."""
    return salted_hmac(
        "reminders.suppression", email.strip().lower(), algorithm="sha256"
    ).hexdigest()


def test_suppressions_and_reports_under_a_punycode_spelling_take_the_addresss_one_key(
    back_to_latest,
):
    apps = migrate_to(BEFORE)
    Suppression = apps.get_model("reminders", "Suppression")
    DeliveryEvent = apps.get_model("reminders", "DeliveryEvent")
    at = datetime(2026, 3, 2, 9, tzinfo=UTC)
    workshop = apps.get_model("workshops", "Workshop").objects.create(
        title="T", starts_at=at, ends_at=at + timedelta(hours=1), timezone="UTC",
    )  # fmt: skip
    attendee = apps.get_model("workshops", "Attendee").objects.create(
        name="Ana", email="ana@xn--bcher-kva.example"
    )
    enrollment = apps.get_model("workshops", "Enrollment").objects.create(
        attendee=attendee, workshop=workshop
    )
    reminder = apps.get_model("reminders", "Reminder").objects.create(
        attendee=attendee, workshop=workshop, enrollment=enrollment, key="k1", status="sent",
        sent_to="ana@xn--bcher-kva.example",
    )  # fmt: skip
    event = DeliveryEvent.objects.create(
        reminder=reminder, channel="http", event_id="e1", kind="bounced", bounce="soft",
        occurred_at=at, received_at=at, address_key=_old_key("ana@xn--bcher-kva.example"),
    )  # fmt: skip
    rows = {}
    for address in (
        "ana@xn--bcher-kva.example",
        "ben@example.org",
        # One mailbox suppressed under both spellings: one live row per key stays.
        "dee@xn--bcher-kva.example",
        "dee@bücher.example",
    ):
        rows[address] = Suppression.objects.create(
            address_key=_old_key(address), address=address, cause="bounced", caused_at=at,
            created_at=at,
        ).pk  # fmt: skip
    apps = migrate_to(AFTER)
    Suppression = apps.get_model("reminders", "Suppression")
    keys = dict(Suppression.objects.values_list("pk", "address_key"))
    assert {address: keys[pk] for address, pk in rows.items()} == {
        "ana@xn--bcher-kva.example": address_key("ana@bücher.example"),
        "ben@example.org": _old_key("ben@example.org"),
        "dee@xn--bcher-kva.example": _old_key("dee@xn--bcher-kva.example"),
        "dee@bücher.example": address_key("dee@xn--bcher-kva.example"),
    }
    assert address_key("ben@example.org") == _old_key("ben@example.org")
    assert apps.get_model("reminders", "DeliveryEvent").objects.get(pk=event.pk).address_key == (
        address_key("ana@bücher.example")
    )
