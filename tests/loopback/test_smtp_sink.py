"""The loopback SMTP server: what it records, what it counts, how it runs alone."""

from __future__ import annotations

import json
import smtplib
from email.message import EmailMessage

import pytest

from clock import SystemClock
from tests.loopback.conftest import start_server_process, stop_server_process

pytestmark = pytest.mark.timeout(30)


def message(message_id: str, subject: str, to: str = "ada@example.com") -> EmailMessage:
    email = EmailMessage()
    email["From"] = "reminders@example.org"
    email["To"] = to
    email["Subject"] = subject
    email["Message-ID"] = message_id
    email.set_content("See you there.")
    return email


def test_duplicates_are_counted_by_message_id_and_by_recipient_and_subject(smtp_sink):
    with smtplib.SMTP("127.0.0.1", smtp_sink.port, timeout=5) as client:
        client.send_message(message("<a@example.org>", "Pottery at 10:00"))
        client.send_message(message("<a@example.org>", "Pottery at 10:00"))  # a re-send
        client.send_message(message("<b@example.org>", "Pottery at 10:00"))  # a second reminder
        client.send_message(message("<c@example.org>", "Pottery at 10:00", to="bo@example.com"))

    received = smtp_sink.received()
    assert [m.message_id for m in received] == [
        "<a@example.org>",
        "<a@example.org>",
        "<b@example.org>",
        "<c@example.org>",
    ]
    assert received[0].rcpt_tos == ("ada@example.com",)
    assert received[0].header("Subject") == "Pottery at 10:00"
    assert smtp_sink.duplicates_by_message_id() == 1
    assert smtp_sink.duplicates_by_recipient_subject() == 2
    assert smtp_sink.stats()["connections_opened"] == 1


def test_scripted_replies_refuse_recipients_and_messages(smtp_sink):
    smtp_sink.script_rcpt("ada@example.com", "451 4.7.1 Greylisted")
    smtp_sink.reply_to_data("554 5.7.1 Rejected")

    with smtplib.SMTP("127.0.0.1", smtp_sink.port, timeout=5) as client:
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            client.send_message(message("<a@example.org>", "One"))
        with pytest.raises(smtplib.SMTPDataError):
            client.send_message(message("<b@example.org>", "Two"))
        client.send_message(message("<c@example.org>", "Three"))

    assert [m.subject for m in smtp_sink.received()] == ["Three"]


def test_dropping_connections_closes_every_client(smtp_sink):
    client = smtplib.SMTP("127.0.0.1", smtp_sink.port, timeout=5)
    try:
        client.noop()
        assert smtp_sink.drop_connections() == 1
        with pytest.raises(smtplib.SMTPServerDisconnected):
            client.noop()
    finally:
        client.close()


def test_the_sink_runs_as_a_separate_process_writing_json_lines(tmp_path):
    jsonl = tmp_path / "received.jsonl"
    process, line = start_server_process("loopback.smtp_sink", "--port", "0", "--jsonl", str(jsonl))
    try:
        assert line.startswith("smtp_sink listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        with smtplib.SMTP("127.0.0.1", port, timeout=5) as client:
            # The line is written before the server answers 250, so it is there on return.
            client.send_message(message("<a@example.org>", "Töpferkurs"))
    finally:
        code = stop_server_process(process)

    [record] = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert record["message_id"] == "<a@example.org>"
    assert record["subject"] == "Töpferkurs"
    assert record["rcpt_tos"] == ["ada@example.com"]
    assert code == 0


def test_headers_read_back_decoded_as_the_email_package_parses_them(smtp_sink):
    """The sink keeps the fields as sent and decodes one when asked: the same text as
    parsing the whole message with the modern policy, encoded words and folding included."""
    from email import message_from_bytes
    from email import policy as email_policy

    subject = "Töpfern für Anfänger um 10:00" + " lang" * 20
    sent = message("<d@example.org>", subject)
    del sent["To"]
    sent["To"] = "Zoë Ångström <zoe@example.com>"
    with smtplib.SMTP("127.0.0.1", smtp_sink.port, timeout=5) as client:
        client.send_message(sent)

    (received,) = smtp_sink.received()
    assert b"=?utf-8?" in received.raw and b"\r\n " in received.raw  # encoded and folded
    parsed = message_from_bytes(received.raw, policy=email_policy.default)
    assert received.headers == tuple((name, str(value)) for name, value in parsed.items())
    assert received.subject == subject
    assert received.header("To") == "Zoë Ångström <zoe@example.com>"


def test_a_header_with_8_bit_bytes_is_accepted_and_written_to_the_jsonl_file(tmp_path):
    """A client that sends UTF-8 in a header unencoded: accepted once, one JSON line."""
    from loopback.smtp_sink import SmtpSink

    jsonl = tmp_path / "smtp.jsonl"
    raw = "Subject: Töpferkurs\r\nMessage-ID: <e@example.org>\r\n\r\nbody\r\n".encode()
    with SmtpSink(jsonl=jsonl) as sink:
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as client:
            client.sendmail("reminders@example.org", ["ada@example.com"], raw)
        assert [m.subject for m in sink.received()] == ["Töpferkurs"]
    (line,) = jsonl.read_text(encoding="utf-8").splitlines()
    record = json.loads(line)
    assert record["subject"] == "Töpferkurs"
    assert ["Subject", "Töpferkurs"] in record["raw_headers"]


def test_a_call_starts_at_its_connections_ehlo_and_later_ones_at_mail_from(smtp_sink):
    # A client frozen between EHLO and MAIL FROM had already begun the call.
    clock = SystemClock()
    with smtplib.SMTP("127.0.0.1", smtp_sink.port, timeout=5) as client:
        client.ehlo()
        mark = clock.monotonic()
        clock.sleep_blocking(0.05)
        client.send_message(message("<a@example.org>", "One"))
        between = clock.monotonic()
        client.send_message(message("<b@example.org>", "Two"))

    first, second = (m.began_at for m in smtp_sink.received())
    assert first < mark < between < second
