"""SmtpChannel against a real loopback SMTP server (aiosmtpd via loopback.smtp_sink)."""

from __future__ import annotations

import re
import socket

import pytest

from delivery import Attachment, DeliveryPolicy, Outcome, deliver
from delivery.channels import SmtpChannel, SmtpSettings
from delivery.message import message_id_for
from loopback.smtp_sink import SmtpSink
from tests.delivery.conftest import run

pytestmark = pytest.mark.timeout(30)

QUICK = DeliveryPolicy(concurrency=5, call_timeout=5, max_attempts=3, backoff_base=0.01)
FROM = "Workshop Reminders <reminders@example.org>"


def channel_for(sink: SmtpSink, clock, **settings) -> SmtpChannel:
    values = {"host": "127.0.0.1", "port": sink.port, "from_email": FROM, "timeout": 5}
    values.update(settings)
    return SmtpChannel(SmtpSettings(**values), clock=clock)


def test_a_batch_reuses_one_connection_and_stamps_a_message_id_derived_from_the_key(
    smtp_sink, system_clock, make_real_envelope
):
    envelopes = [make_real_envelope() for _ in range(5)]
    channel = channel_for(smtp_sink, system_clock)

    results = run(deliver(envelopes, channel, policy=QUICK, clock=system_clock))

    assert [r.outcome for r in results] == [Outcome.SENT] * 5
    assert [r.message_id for r in results] == [
        message_id_for(e.key, "example.org") for e in envelopes
    ]
    received = smtp_sink.received()
    assert sorted(m.message_id for m in received) == sorted(r.message_id for r in results)
    assert smtp_sink.connections_opened == 1
    # QUIT at the end of the batch. The sink drops the connection on its own
    # thread once the socket closes, a moment after the batch has returned.
    deadline = system_clock.monotonic() + 2.0
    while smtp_sink.open_connections and system_clock.monotonic() < deadline:
        system_clock.sleep_blocking(0.01)
    assert smtp_sink.open_connections == 0
    assert received[0].mail_from == "reminders@example.org"
    assert received[0].header("From") == FROM


def test_header_injection_through_subject_or_name_adds_no_header_and_no_recipient(
    smtp_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope(
        recipient="ada@example.com",
        recipient_name="Ada\r\nBcc: victim@example.com",
        subject="Reminder\r\nBcc: victim@example.com\r\n\r\nInjected body",
    )

    [result] = run(
        deliver([envelope], channel_for(smtp_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert result.outcome is Outcome.SENT
    [message] = smtp_sink.received()
    assert message.rcpt_tos == ("ada@example.com",)
    assert message.header_all("Bcc") == []
    assert message.header_all("Subject") == ["Reminder Bcc: victim@example.com Injected body"]
    assert message.header("To") == '"Ada Bcc: victim@example.com" <ada@example.com>'
    assert message.parsed().get_content() == "See you there.\r\n"


def test_non_ascii_names_and_subjects_arrive_intact_as_encoded_words(
    smtp_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope(
        recipient="zoe@example.com",
        recipient_name="Zoë Ångström",
        subject="Erinnerung: Töpferkurs 🎨 beginnt in einer Stunde",
        text_body="Bis gleich — 10:00 Uhr (Europe/Berlin).",
    )

    run(deliver([envelope], channel_for(smtp_sink, system_clock), policy=QUICK, clock=system_clock))

    [message] = smtp_sink.received()
    assert message.subject == "Erinnerung: Töpferkurs 🎨 beginnt in einer Stunde"
    assert message.header("To") == "Zoë Ångström <zoe@example.com>"
    assert message.raw.isascii()  # headers encoded, body transfer-encoded
    assert message.parsed().get_content() == "Bis gleich — 10:00 Uhr (Europe/Berlin).\r\n"


def test_html_alternative_and_attachments_are_sent_as_mime_parts(
    smtp_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope(
        html_body="<p>See you there.</p>",
        attachments=[
            Attachment(filename="workshop.ics", content_type="text/calendar", content=b"BEGIN:X")
        ],
    )

    run(deliver([envelope], channel_for(smtp_sink, system_clock), policy=QUICK, clock=system_clock))

    parsed = smtp_sink.received()[0].parsed()
    assert parsed.get_body(("html",)).get_content() == "<p>See you there.</p>\r\n"
    [attachment] = list(parsed.iter_attachments())
    assert attachment.get_filename() == "workshop.ics"
    assert attachment.get_content() in (b"BEGIN:X", "BEGIN:X")


def test_a_4xx_reply_is_retried_and_the_message_arrives_once(
    smtp_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope()
    smtp_sink.script_rcpt(envelope.recipient, "451 4.7.1 Greylisted, try again later")

    [result] = run(
        deliver([envelope], channel_for(smtp_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.attempts) == (Outcome.SENT, 2)
    assert len(smtp_sink.received()) == 1
    assert smtp_sink.connections_opened == 1  # RSET kept the connection usable


def test_a_5xx_reply_fails_permanently_with_the_servers_words(
    smtp_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope()
    smtp_sink.script_rcpt(envelope.recipient, "550 5.1.1 No such user here")

    [result] = run(
        deliver([envelope], channel_for(smtp_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.attempts) == (Outcome.PERMANENT, 1)
    assert result.error == "SMTP 550 on RCPT TO: 5.1.1 No such user here"
    assert result.maybe_delivered is False
    assert smtp_sink.received() == []


def test_a_message_refused_at_data_fails_permanently(smtp_sink, system_clock, make_real_envelope):
    smtp_sink.reply_to_data("554 5.7.1 Message rejected as spam")

    [result] = run(
        deliver(
            [make_real_envelope()],
            channel_for(smtp_sink, system_clock),
            policy=QUICK,
            clock=system_clock,
        )
    )

    assert result.outcome is Outcome.PERMANENT
    assert result.error == "SMTP 554 on DATA: 5.7.1 Message rejected as spam"


def test_a_pooled_connection_dropped_by_the_server_is_replaced_once(
    smtp_sink, system_clock, make_real_envelope
):
    channel = channel_for(smtp_sink, system_clock)

    async def scenario():
        async with channel:
            first = await channel.send(make_real_envelope())
            assert smtp_sink.drop_connections() == 1
            second = await channel.send(make_real_envelope())
        return first, second

    first, second = run(scenario())

    assert first != second
    assert len(smtp_sink.received()) == 2
    assert smtp_sink.connections_opened == 2


def test_a_slow_server_times_out_and_is_not_retried_because_smtp_has_no_keys(
    smtp_sink, system_clock, make_real_envelope
):
    smtp_sink.data_delay = 2.0
    envelopes = [make_real_envelope(), make_real_envelope()]
    policy = DeliveryPolicy(call_timeout=0.3, max_attempts=3)
    began = system_clock.monotonic()

    results = run(
        deliver(envelopes, channel_for(smtp_sink, system_clock), policy=policy, clock=system_clock)
    )

    assert [r.outcome for r in results] == [Outcome.TIMED_OUT] * 2
    assert all(r.attempts == 1 and r.maybe_delivered for r in results)
    # Two 0.3 s timeouts, not the server's 2 s per message (and no retries: attempts == 1).
    assert system_clock.monotonic() - began < 2 * smtp_sink.data_delay


def test_a_server_that_refuses_connections_was_never_reached(system_clock, make_real_envelope):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    channel = SmtpChannel(
        SmtpSettings(host="127.0.0.1", port=port, from_email=FROM), clock=system_clock
    )

    [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

    assert result.outcome is Outcome.TRANSIENT
    assert (result.attempts, result.provider_reached, result.maybe_delivered) == (3, False, False)
    assert result.error.startswith(
        "gave up after 3 tries (max_attempts=3); last error: "
        f"could not connect to SMTP server 127.0.0.1:{port}: "
    )


def test_login_with_credentials_and_a_wrong_password_fails_permanently(
    system_clock, make_real_envelope
):
    with SmtpSink(credentials=("mailer", "correct")) as sink:
        login = {"username": "mailer", "allow_plaintext_auth": True}
        good = channel_for(sink, system_clock, password="correct", **login)
        bad = channel_for(sink, system_clock, password="wrong", **login)

        [sent] = run(deliver([make_real_envelope()], good, policy=QUICK, clock=system_clock))
        [refused] = run(deliver([make_real_envelope()], bad, policy=QUICK, clock=system_clock))

        assert sent.outcome is Outcome.SENT
        assert sink.logins == ["mailer"]
    assert refused.outcome is Outcome.PERMANENT
    assert refused.provider_reached is False
    assert refused.error.endswith("check the username and password")


def test_a_non_ascii_mailbox_fails_permanently_without_a_call(
    smtp_sink, system_clock, make_real_envelope
):
    [result] = run(
        deliver(
            [make_real_envelope(recipient="jürgen@example.com")],
            channel_for(smtp_sink, system_clock),
            policy=QUICK,
            clock=system_clock,
        )
    )

    assert result.outcome is Outcome.PERMANENT
    assert result.provider_reached is False
    assert "needs SMTPUTF8" in result.error
    assert smtp_sink.connections_opened == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"host": ""}, "SmtpSettings.host is empty"),
        ({"from_email": ""}, "SmtpSettings.from_email is empty"),
        (
            {"from_email": "not an address"},
            "SmtpSettings.from_email 'not an address' is not a usable",
        ),
        ({"use_tls": True, "starttls": True}, "use_tls and starttls are mutually exclusive"),
        ({"username": "u"}, "needs both username and password"),
        ({"port": 0}, "SmtpSettings.port must be 1-65535 (got 0)"),
    ],
)
def test_bad_settings_fail_at_construction(settings, message):
    values = {"host": "smtp.example.org", "from_email": FROM}
    values.update(settings)

    with pytest.raises(ValueError, match=re.escape(message)):
        SmtpSettings(**values)


def test_starttls_upgrades_the_connection_before_the_message_is_sent(
    server_tls, system_clock, make_real_envelope
):
    with SmtpSink(tls_context=server_tls) as sink:
        channel = channel_for(sink, system_clock, starttls=True, validate_certs=False)

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert result.outcome is Outcome.SENT
        assert [m.tls for m in sink.received()] == [True]


def test_a_server_requiring_starttls_refuses_a_plain_session_permanently(
    server_tls, system_clock, make_real_envelope
):
    """starttls=False against a server that demands it is a configuration error."""
    with SmtpSink(tls_context=server_tls) as sink:
        channel = channel_for(sink, system_clock, starttls=False)

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert (result.outcome, result.attempts) == (Outcome.PERMANENT, 1)
        assert result.error.startswith("SMTP 530 on MAIL FROM")
        assert sink.received() == []


def test_implicit_tls_connects_over_tls_from_the_first_byte(
    server_tls, system_clock, make_real_envelope
):
    with SmtpSink(tls_context=server_tls, implicit_tls=True) as sink:
        channel = channel_for(sink, system_clock, use_tls=True, validate_certs=False)

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert result.outcome is Outcome.SENT
        assert [m.tls for m in sink.received()] == [True]


# --- Issue 11, item 3: STARTTLS whenever offered, no password in clear text ----------


def test_starttls_is_used_whenever_the_server_offers_it(
    server_tls, system_clock, make_real_envelope
):
    """The default (starttls=None, EMAIL_USE_TLS unset) upgrades when STARTTLS is offered."""
    with SmtpSink(tls_context=server_tls, require_starttls=False) as sink:
        channel = channel_for(sink, system_clock, validate_certs=False)

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert result.outcome is Outcome.SENT
        assert [m.tls for m in sink.received()] == [True]


def test_a_login_happens_only_after_the_upgrade(server_tls, system_clock, make_real_envelope):
    with SmtpSink(
        tls_context=server_tls, require_starttls=False, credentials=("mailer", "secret")
    ) as sink:
        channel = channel_for(
            sink, system_clock, username="mailer", password="secret", validate_certs=False
        )

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert result.outcome is Outcome.SENT
        assert sink.auth_attempts == [("mailer", True)]
        assert [m.tls for m in sink.received()] == [True]


def test_no_password_is_sent_to_a_server_without_tls(system_clock, make_real_envelope):
    """The server would accept AUTH in clear text: the channel refuses to offer it."""
    with SmtpSink(credentials=("mailer", "secret")) as sink:
        channel = channel_for(sink, system_clock, username="mailer", password="secret")

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert sink.auth_attempts == []
        assert sink.received() == []
    assert (result.outcome, result.provider_reached) == (Outcome.PERMANENT, False)
    assert "offers no TLS, so the password would cross the network in clear text" in (result.error)
    assert "EMAIL_ALLOW_PLAINTEXT_AUTH=1" in result.error
    assert "secret" not in result.error


def test_plaintext_login_is_allowed_only_when_the_operator_says_so(
    system_clock, make_real_envelope
):
    with SmtpSink(credentials=("mailer", "secret")) as sink:
        channel = channel_for(
            sink, system_clock, username="mailer", password="secret", allow_plaintext_auth=True
        )

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert result.outcome is Outcome.SENT
        assert sink.auth_attempts == [("mailer", False)]


def test_django_settings_map_to_starttls_when_offered_and_no_plaintext_login(settings):
    from reminders.bridge import smtp_settings

    settings.EMAIL_USE_TLS = False
    assert (smtp_settings().starttls, smtp_settings().allow_plaintext_auth) == (None, False)
    settings.EMAIL_USE_TLS = True
    settings.EMAIL_ALLOW_PLAINTEXT_AUTH = True
    assert (smtp_settings().starttls, smtp_settings().allow_plaintext_auth) == (True, True)
