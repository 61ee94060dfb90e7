"""The smtp channel signs with DKIM when a key is configured: a real SMTP server on loopback
receives the message, and dkimpy verifies it against the published key (a DNS lookup
answered from the test), covering RFC 8058's two headers."""

from __future__ import annotations

import base64
import re
import subprocess

import dkim
import pytest

from reminders.worker import bridge

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def rsa_key(tmp_path_factory) -> tuple[str, bytes]:
    """A new 2048-bit RSA key: its PEM file's path, and the DNS TXT record publishing it."""
    path = tmp_path_factory.mktemp("dkim") / "private.pem"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(path), "2048"], check=True, capture_output=True
    )
    public = subprocess.run(
        ["openssl", "rsa", "-in", str(path), "-pubout", "-outform", "DER"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    return str(path), b"v=DKIM1; k=rsa; p=" + base64.b64encode(public)


def _send(settings, smtp_sink, clock, make_envelope_for):
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    [result] = bridge.deliver_envelopes(
        [make_envelope_for()], channel="smtp", clock=clock, budget=10
    )
    assert result.ok, result.error
    [message] = smtp_sink.received()
    return message.raw


@pytest.fixture
def envelope(clock, make_workshop, enrol, settings):
    from reminders.content import reminder_envelope
    from reminders.models import Reminder

    clock.autojump = False
    settings.REMINDERS_PUBLIC_URL = "https://reminders.example.com"
    workshop = make_workshop()
    enrol(workshop, count=1)

    def make():
        reminder = Reminder.objects.select_related("attendee", "workshop").get()
        return reminder_envelope(reminder=reminder)

    return make


def _dns(record: bytes):
    """Return the names looked up, and a resolver answering each with the key's record."""
    asked = []

    def dns(name, timeout=5):
        asked.append(name)
        return record

    return asked, dns


def test_a_configured_key_signs_each_message_over_both_unsubscribe_headers(
    settings, smtp_sink, clock, envelope, rsa_key
):
    path, record = rsa_key
    settings.REMINDERS_DKIM_SELECTOR, settings.REMINDERS_DKIM_KEY_FILE = "r2026", path
    raw = _send(settings, smtp_sink, clock, envelope)
    assert raw.startswith(b"DKIM-Signature:")
    asked, dns = _dns(record)
    assert dkim.verify(raw, dnsfunc=dns) is True
    assert asked == [b"r2026._domainkey.example.com."]
    signed = re.search(rb"h=([^;]+);", raw.replace(b"\r\n ", b"").replace(b"\r\n\t", b""))
    names = {name.strip().lower() for name in signed.group(1).split(b":")}
    assert {b"list-unsubscribe", b"list-unsubscribe-post", b"from", b"subject"} <= names
    # Changed on the way, it no longer verifies.
    tampered = raw.replace(
        b"List-Unsubscribe-Post: List-Unsubscribe=One-Click", b"List-Unsubscribe-Post: x"
    )
    assert dkim.verify(tampered, dnsfunc=dns) is False


def test_a_dkim_domain_setting_signs_under_that_domain_not_the_senders(
    settings, smtp_sink, clock, envelope, rsa_key
):
    """REMINDERS_DKIM_DOMAIN: a relay's domain, where the key is published, signs instead."""
    path, record = rsa_key
    settings.REMINDERS_DKIM_SELECTOR, settings.REMINDERS_DKIM_KEY_FILE = "r2026", path
    settings.REMINDERS_DKIM_DOMAIN = "mail.example.net"
    raw = _send(settings, smtp_sink, clock, envelope)
    asked, dns = _dns(record)
    assert dkim.verify(raw, dnsfunc=dns) is True
    assert asked == [b"r2026._domainkey.mail.example.net."]


def test_without_a_key_nothing_is_signed(settings, smtp_sink, clock, envelope):
    assert settings.REMINDERS_DKIM_KEY_FILE == ""
    assert not _send(settings, smtp_sink, clock, envelope).startswith(b"DKIM-Signature:")


def test_a_key_that_cannot_sign_stops_the_channel_naming_the_setting(settings, clock, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    settings.REMINDERS_DKIM_SELECTOR, settings.REMINDERS_DKIM_KEY_FILE = "r2026", str(bad)
    with pytest.raises(ValueError, match="REMINDERS_DKIM_KEY_FILE: The DKIM key cannot sign"):
        bridge.check_channel("smtp", clock=clock)
