"""FileChannel: one .eml per key, written atomically, replaced on re-send.

Writes happen in a worker thread (real I/O), so these tests use the system
clock: a FakeClock would jump its virtual time while the thread works.
"""

from __future__ import annotations

from email import message_from_bytes
from email import policy as email_policy

import pytest

from delivery import DeliveryLimits, Outcome, deliver
from delivery.channels import FileChannel
from delivery.message import message_id_for
from tests.delivery.conftest import run

pytestmark = pytest.mark.timeout(30)


def read(path):
    return message_from_bytes(path.read_bytes(), policy=email_policy.default)


def test_each_envelope_becomes_one_eml_file_named_after_its_key(
    tmp_path, system_clock, make_real_envelope
):
    outbox = tmp_path / "outbox"
    channel = FileChannel(outbox, from_email="reminders@example.org", clock=system_clock)
    envelopes = [make_real_envelope(subject="Töpferkurs") for _ in range(3)]

    results = run(deliver(envelopes, channel, policy=DeliveryLimits(), clock=system_clock))

    assert [r.outcome for r in results] == [Outcome.SENT] * 3
    assert sorted(p.name for p in outbox.iterdir()) == sorted(
        channel.path_for(e.key).name for e in envelopes
    )
    parsed = read(channel.path_for(envelopes[0].key))
    assert parsed["Subject"] == "Töpferkurs"
    assert parsed["Message-ID"] == message_id_for(envelopes[0].key, "example.org")
    assert results[0].message_id == parsed["Message-ID"]


def test_a_resend_replaces_the_file_instead_of_adding_one(
    tmp_path, system_clock, make_real_envelope
):
    """The workshop moved: the second send of the key leaves only the new text."""
    channel = FileChannel(tmp_path, from_email="reminders@example.org", clock=system_clock)
    before = make_real_envelope(1, text_body="Starts at 10:00.")
    after = make_real_envelope(1, text_body="Moved: starts at 11:00.")

    run(deliver([before], channel, policy=DeliveryLimits(), clock=system_clock))
    run(deliver([after], channel, policy=DeliveryLimits(), clock=system_clock))

    assert [p.name for p in tmp_path.iterdir()] == [channel.path_for(after.key).name]
    assert read(channel.path_for(after.key)).get_content() == "Moved: starts at 11:00.\r\n"


def test_a_file_channel_needs_a_usable_sender(tmp_path, system_clock):
    with pytest.raises(ValueError, match="FileChannel from_email is empty"):
        FileChannel(tmp_path, from_email="", clock=system_clock)


def test_a_file_that_cannot_be_written_is_retried_and_leaves_no_partial_file(
    tmp_path, system_clock, make_real_envelope
):
    """Here a directory stands where the file goes, as a full disk would fail the write."""
    channel = FileChannel(tmp_path, from_email="reminders@example.org", clock=system_clock)
    envelope = make_real_envelope()
    channel.path_for(envelope.key).mkdir()
    policy = DeliveryLimits(max_attempts=2, backoff_base=0.01)

    [result] = run(deliver([envelope], channel, policy=policy, clock=system_clock))

    assert (result.outcome, result.attempts) == (Outcome.TRANSIENT, 2)
    assert f"could not write {channel.path_for(envelope.key)}: " in result.error
    assert [p.name for p in tmp_path.iterdir()] == [channel.path_for(envelope.key).name]
