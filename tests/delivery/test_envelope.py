"""Envelopes are immutable values; programming errors fail at construction."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime, timedelta, timezone

import pytest

from delivery import Attachment, Envelope, FrozenMap


def test_an_envelope_cannot_be_changed_after_construction(make_envelope):
    envelope = make_envelope()

    with pytest.raises(dataclasses.FrozenInstanceError):
        envelope.recipient = "other@example.com"
    with pytest.raises(TypeError):
        envelope.payload["workshop_title"] = "Changed"  # type: ignore[index]


def test_the_payload_is_copied_so_later_changes_to_the_source_do_not_leak_in(make_envelope):
    source = {"workshop_title": "Pottery"}
    envelope = make_envelope(payload=source)
    source["workshop_title"] = "Changed"

    assert envelope.payload == {"workshop_title": "Pottery"}
    assert isinstance(envelope.payload, FrozenMap)


def test_an_envelope_is_hashable_and_survives_pickling(make_envelope):
    envelope = make_envelope(
        attachments=[Attachment(filename="invite.ics", content_type="text/calendar", content=b"X")]
    )

    assert pickle.loads(pickle.dumps(envelope)) == envelope
    assert hash(pickle.loads(pickle.dumps(envelope))) == hash(envelope)
    assert envelope.attachments == (
        Attachment(filename="invite.ics", content_type="text/calendar", content=b"X"),
    )


def test_the_deadline_is_normalised_to_utc(make_envelope):
    berlin = timezone(timedelta(hours=1))
    envelope = make_envelope(deadline_at=datetime(2026, 3, 2, 10, 0, tzinfo=berlin))

    assert envelope.deadline_at.isoformat() == "2026-03-02T09:00:00+00:00"


@pytest.mark.parametrize("name", ["deadline_at", "send_by"])
def test_a_naive_deadline_is_refused(make_envelope, name):
    with pytest.raises(ValueError, match=f"{name} is naive; pass an aware datetime"):
        make_envelope(**{name: datetime(2026, 3, 2, 10, 0)})


@pytest.mark.parametrize("key", ["", "line\nbreak", "ü-key", "k" * 256])
def test_a_key_that_cannot_be_a_header_is_refused(make_envelope, key):
    with pytest.raises(ValueError, match="Envelope.key"):
        make_envelope(key=key)


def test_a_payload_value_that_is_not_text_is_refused(make_envelope):
    with pytest.raises(TypeError, match="payload keys and values must be str"):
        make_envelope(payload={"seats": 3})


def test_a_bad_recipient_is_accepted_here_and_judged_at_delivery(make_envelope):
    """Building a batch never fails on one bad address; delivery reports it."""
    assert make_envelope(recipient="").recipient == ""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"filename": "../etc/passwd"}, "must be a non-empty base name"),
        ({"filename": "a\r\nb.txt"}, "must be a non-empty base name"),
        ({"content_type": "calendar"}, "must look like 'type/subtype'"),
    ],
)
def test_an_unsafe_attachment_is_refused(fields, message):
    values = {"filename": "invite.ics", "content_type": "text/calendar", "content": b"X"}
    values.update(fields)

    with pytest.raises(ValueError, match=message):
        Attachment(**values)


def test_envelope_fields_are_keyword_only():
    with pytest.raises(TypeError):
        Envelope(1, "k", "a@example.com", "A", "S", "T", datetime(2026, 3, 2, tzinfo=UTC))


@pytest.mark.parametrize(
    "url",
    [
        "https://reminders.example.com/my reminders/unsubscribe/t/",  # REMINDERS_PUBLIC_URL
        "https://reminders.example.com/x>, <mailto:all@example.com",  # with a space or '>'
        "javascript:alert(1)",
    ],
)
def test_an_unsubscribe_url_that_cannot_be_one_header_link_is_refused(make_envelope, url):
    """Settings accept a public URL whose path holds a space: List-Unsubscribe would break."""
    with pytest.raises(ValueError, match="must be one http\\(s\\) URL"):
        make_envelope(unsubscribe_url=url)


@pytest.mark.parametrize(
    "url",
    [
        "https://reminders.example.com/u/t/\r\nBcc:victim@example.com",
        "https://reminders.example.com/u/t/\nX-Injected:1",
        "https://reminders.example.com/u/\tt/",
    ],
    ids=["crlf", "lf", "tab"],
)
def test_a_control_character_in_the_unsubscribe_url_is_refused_so_it_cannot_add_a_header(
    make_envelope, url
):
    """List-Unsubscribe carries the URL as it is: a line break in it would start a header
    of its own (a Bcc), and no space or angle bracket gives it away."""
    with pytest.raises(ValueError, match=r"Envelope\.unsubscribe_url .* must be one http\(s\) URL"):
        make_envelope(unsubscribe_url=url)
