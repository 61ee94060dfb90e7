"""SmtpChannel against a real loopback SMTP server (aiosmtpd via loopback.smtp_sink)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import smtplib
import socket

import pytest

from delivery import Attachment, DeliveryLimits, DeliveryResult, Outcome, deliver
from delivery.channels import SmtpChannel, SmtpSettings
from delivery.channels.smtp import translate_smtplib_error
from delivery.errors import OutcomeUnknownError, PermanentError, TransientError
from delivery.message import message_id_for
from loopback._loop_thread import LoopThread
from loopback.smtp_sink import SmtpSink
from tests.delivery.conftest import run

pytestmark = pytest.mark.timeout(30)

QUICK = DeliveryLimits(concurrency=5, call_timeout=5, max_attempts=3, backoff_base=0.01)
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


def test_a_line_break_in_the_recipient_never_reaches_the_command_stream(
    smtp_sink, system_clock, make_real_envelope
):
    """Called without the engine, whose address check refuses it first, the channel still
    writes no command an address smuggled in."""
    envelope = make_real_envelope(recipient="ada@example.com>\r\nRCPT TO:<victim@example.com")
    channel = channel_for(smtp_sink, system_clock)

    async def send():
        async with channel:
            await channel.send(envelope)

    with pytest.raises(PermanentError, match="control character") as refused:
        run(send())
    assert not refused.value.reached
    assert smtp_sink.received() == []


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
    policy = DeliveryLimits(call_timeout=0.3, max_attempts=3)
    began = system_clock.monotonic()

    results = run(
        deliver(envelopes, channel_for(smtp_sink, system_clock), policy=policy, clock=system_clock)
    )

    assert [r.outcome for r in results] == [Outcome.TIMED_OUT] * 2
    assert all(r.attempts == 1 and r.maybe_delivered for r in results)
    # Two 0.3 s timeouts, not the server's 2 s per message (and no retries: attempts == 1).
    assert system_clock.monotonic() - began < 2 * smtp_sink.data_delay


def test_a_server_that_refuses_connections_was_never_reached(
    system_clock, make_real_envelope, refusing_port
):
    port = refusing_port()
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
        ({"from_email": "a@example.org\r\nBcc: b@example.org"}, "contains a line break"),
        ({"timeout": 0}, "SmtpSettings.timeout must be seconds > 0 (got 0)"),
        ({"max_connections": 0}, "SmtpSettings.max_connections must be >= 1 (got 0)"),
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
    from reminders.worker.bridge import smtp_settings

    settings.EMAIL_USE_TLS = False
    assert (smtp_settings().starttls, smtp_settings().allow_plaintext_auth) == (None, False)
    settings.EMAIL_USE_TLS = True
    settings.EMAIL_ALLOW_PLAINTEXT_AUTH = True
    assert (smtp_settings().starttls, smtp_settings().allow_plaintext_auth) == (True, True)


# --- Issue 34, item 10: TLS required but to this machine or a listed host --------------


@pytest.mark.parametrize(
    ("host", "listed", "plain"),
    [
        ("localhost", (), True),
        ("LocalHost.", (), True),
        ("127.0.0.1", (), True),
        ("127.3.2.1", (), True),
        ("::1", (), True),
        ("::ffff:127.0.0.1", (), True),
        ("smtp.example.org", (), False),
        ("mailpit", (), False),
        ("192.168.1.20", (), False),
        ("10.0.0.1", (), False),
        ("0.0.0.0", (), False),
        ("::", (), False),
        ("128.0.0.1", (), False),
        ("localhost.example.org", (), False),
        ("127.0.0.1.example.org", (), False),
        ("foo.localhost", (), False),
        ("", (), False),
        ("mailpit", ("mailpit",), True),
        ("Mailpit", ("mailpit.",), True),
        ("relay.internal", ("mailpit", "RELAY.internal"), True),
        ("relay.internal.evil.example", ("relay.internal",), False),
        ("smtp.example.org", ("mailpit",), False),
        ("", ("",), False),
    ],
)
def test_plain_smtp_is_allowed_only_to_this_machine_and_to_listed_hosts(host, listed, plain):
    from delivery.channels.smtp import plaintext_smtp_allowed

    assert plaintext_smtp_allowed(host, listed) is plain


@pytest.mark.parametrize(
    "tls_mode",
    [{"require_tls": True}, {"require_tls": True, "starttls": True}, {"starttls": True}],
    ids=["required-for-the-host", "required-and-EMAIL_USE_TLS", "EMAIL_USE_TLS"],
)
def test_where_tls_is_required_a_server_without_starttls_gets_nothing_and_it_is_retried(
    smtp_sink, system_clock, make_real_envelope, tls_mode
):
    """No STARTTLS offered (or the offer stripped on the way): not even MAIL FROM is sent,
    the error says what to do, and the reminder is a transient failure that never reached
    the provider (retried later, like a refused connection), not a refusal of the message."""
    channel = channel_for(smtp_sink, system_clock, **tls_mode)

    [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

    assert smtp_sink.mail_commands == []
    assert smtp_sink.received() == []
    assert (result.outcome, result.provider_reached, result.maybe_delivered) == (
        Outcome.TRANSIENT,
        False,
        False,
    )
    assert result.attempts == QUICK.max_attempts
    assert f"SMTP server 127.0.0.1:{smtp_sink.port} offers no STARTTLS" in result.error
    assert "nothing was sent" in result.error
    for advice in ("EMAIL_USE_TLS=1", "EMAIL_USE_SSL=1", "list 127.0.0.1 in EMAIL_PLAINTEXT_HOSTS"):
        assert advice in result.error


def test_where_tls_is_required_the_message_goes_out_over_starttls_and_never_in_clear(
    server_tls, system_clock, make_real_envelope
):
    """The same settings, two servers: the one without STARTTLS gets nothing, the one that
    offers it (without demanding it) gets the message over TLS."""
    envelope = make_real_envelope()
    with SmtpSink() as plain, SmtpSink(tls_context=server_tls, require_starttls=False) as tls:
        for sink in (plain, tls):
            channel = channel_for(sink, system_clock, require_tls=True, validate_certs=False)
            run(deliver([envelope], channel, policy=QUICK, clock=system_clock))

        assert (plain.mail_commands, plain.received()) == ([], [])
        assert tls.mail_commands == [("reminders@example.org", True)]
        assert [m.tls for m in tls.received()] == [True]


def test_where_tls_is_required_implicit_tls_is_enough(server_tls, system_clock, make_real_envelope):
    with SmtpSink(tls_context=server_tls, implicit_tls=True) as sink:
        channel = channel_for(
            sink, system_clock, require_tls=True, use_tls=True, validate_certs=False
        )

        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        assert result.outcome is Outcome.SENT
        assert [m.tls for m in sink.received()] == [True]


def test_require_tls_with_starttls_off_and_no_implicit_tls_fails_at_construction():
    with pytest.raises(ValueError, match="require_tls needs TLS, but starttls=False"):
        SmtpSettings(host="smtp.example.org", from_email=FROM, require_tls=True, starttls=False)


class _ScriptedServer:
    """A raw SMTP server on loopback, offering PIPELINING unless told not to: each command
    line (EHLO too) gets the next reply its script holds for that verb ("CLOSE": hang up
    instead, in one segment with the replies before it), sent in ``pieces`` (bytes written
    apart, a moment between them); it records every line the client sent and each message
    body."""

    def __init__(
        self,
        replies: dict[str, list[str]],
        *,
        pieces: int = 1,
        later: bytes = b"",
        greeting: str = "220 scripted ESMTP",
        pipelining: tuple[bool, ...] = (True,),
        stall: float = 0.0,
        slow: dict[str, float] | None = None,
        hang_up_in_data: bool = False,
    ) -> None:
        self.replies = {verb: list(answers) for verb, answers in replies.items()}
        self.pieces = pieces
        self.later = later  # written 50 ms after the first message's reply, unasked
        self.greeting = greeting
        self.pipelining = list(pipelining)  # per connection; the last one for any later
        self.stall = stall  # seconds between the 354 and reading the message
        self.slow = slow or {}  # seconds before answering a verb
        self.hang_up_in_data = hang_up_in_data  # after the stall, instead of reading the message
        self.open = 0
        self.lines: list[bytes] = []
        self.bodies: list[bytes] = []
        self._thread = LoopThread("scripted-smtp")
        self.port = 0
        self.connections = 0

    def _reply(self, verb: str, default: str) -> bytes:
        answers = self.replies.get(verb)
        return ((answers.pop(0) if answers else default) + "\r\n").encode()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        self.open += 1
        try:
            await self._converse(reader, writer)
        finally:
            self.open -= 1
            writer.close()

    async def _converse(self, reader, writer) -> None:

        async def send(data: bytes) -> None:
            size = max(1, len(data) // self.pieces)
            for start in range(0, len(data), size):
                writer.write(data[start : start + size])
                await writer.drain()
                await asyncio.sleep(0.01)

        pipelining = self.pipelining.pop(0) if len(self.pipelining) > 1 else self.pipelining[0]
        await send(self.greeting.encode() + b"\r\n")
        pending = b""
        while line := await reader.readline():
            self.lines.append(line.rstrip(b"\r\n"))
            verb = line[:4].upper().decode("ascii", "replace").strip()
            await asyncio.sleep(self.slow.get(verb, 0))
            if verb == "EHLO":
                offer = "250-PIPELINING\r\n" if pipelining else ""
                pending += self._reply("EHLO", f"250-scripted\r\n{offer}250 HELP")
            elif verb == "DATA":
                reply = self._reply("DATA", "354 go ahead")
                if not reply.startswith(b"354"):
                    pending += reply
                else:  # DATA accepted: the group's replies go out, then the message is read
                    await send(pending + reply)
                    pending = b""
                    await asyncio.sleep(self.stall)
                    if self.hang_up_in_data:
                        break  # the message unread: the client's next write finds it gone
                    # In blocks, not line by line: a loaded host read a 6 MB message's
                    # lines slower than the client's 1 s wait for the reply.
                    body, end = bytearray(b"\r\n"), -1  # as if after a line: "." ends it
                    while end < 0 and (part := await reader.read(65536)):
                        body += part
                        end = body.find(b"\r\n.\r\n", max(0, len(body) - len(part) - 4))
                    if end < 0:
                        break  # the client went away mid-message: nothing was received
                    reader._buffer[:0] = body[end + 5 :]  # a pipelined command after the dot
                    self.bodies.append(bytes(body[2 : end + 2]))
                    pending += self._reply("END", "250 accepted")
                    if self.later:
                        await send(pending)
                        pending = b""
                        await asyncio.sleep(0.05)
                        await send(self.later)
                        self.later = b""
            elif verb == "QUIT":
                await send(pending + b"221 bye\r\n")
                break
            else:
                pending += self._reply(verb, "250 OK")
            if pending.endswith(b"CLOSE\r\n"):
                # The last replies and the hang-up in one segment (corked): the client reads
                # its reply and finds the connection closed in the same turn of its loop.
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                writer.write(pending.removesuffix(b"CLOSE\r\n"))
                sock.shutdown(socket.SHUT_WR)
                break
            # Answer when the client has nothing more buffered: a pipelined group at once.
            if not reader._buffer:
                await send(pending)
                pending = b""

    def __enter__(self) -> _ScriptedServer:
        self._thread.start()

        async def listen():
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            return server

        self._server = self._thread.run(listen)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info) -> None:
        async def close():
            self._server.close()

        self._thread.run(close)
        self._thread.stop()


def _assert_all_closed(server: _ScriptedServer, clock) -> None:
    """Wait up to 3 s for the server to see every connection closed."""
    deadline = clock.monotonic() + 3.0
    while server.open and clock.monotonic() < deadline:
        clock.sleep_blocking(0.02)
    assert server.open == 0


def _scripted_channel(server: _ScriptedServer, clock) -> SmtpChannel:
    return SmtpChannel(
        SmtpSettings(
            host="127.0.0.1", port=server.port, from_email=FROM, timeout=5, starttls=False
        ),
        clock=clock,
    )


def _one_through(server: _ScriptedServer, clock, envelope) -> DeliveryResult:
    [result] = run(deliver([envelope], _scripted_channel(server, clock), policy=QUICK, clock=clock))
    return result


def test_with_pipelining_a_message_is_two_writes_and_without_it_four(
    smtp_sink, system_clock, make_real_envelope, monkeypatch
):
    """The envelope (MAIL FROM, RCPT TO, DATA) goes as one group when the server offers
    PIPELINING; otherwise each command waits for its reply."""
    writes: list[bytes] = []
    channel = channel_for(smtp_sink, system_clock)

    async def scenario():
        async with channel:
            await channel.send(make_real_envelope())  # opens the connection
            ours = channel._idle[0].transport
            kind = type(ours)
            real_write = kind.write

            def counted(transport, data):
                if transport is ours:  # not the sink's, in this process too
                    writes.append(bytes(data))
                return real_write(transport, data)

            monkeypatch.setattr(kind, "write", counted)
            await channel.send(make_real_envelope())
            monkeypatch.undo()

    run(scenario())

    assert len(smtp_sink.received()) == 2
    if smtp_sink.pipelining:
        assert len(writes) == 2, writes
        assert re.fullmatch(rb"MAIL FROM:<[^>]+>\r\nRCPT TO:<[^>]+>\r\nDATA\r\n", writes[0])
    else:
        assert len(writes) == 4, writes


def test_pipelined_replies_split_and_merged_across_packets_are_paired_in_order(
    system_clock, make_real_envelope
):
    """Each reply of the group is written in three pieces a moment apart, multi-line ones
    included: every reply still goes with its own command."""
    with _ScriptedServer(
        {"MAIL": ["250-sender\r\n250 ok"], "RCPT": ["250-recipient\r\n250 ok"]}, pieces=3
    ) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert result.outcome is Outcome.SENT, result.error
    assert len(server.bodies) == 1


def test_a_pipelined_refusal_sends_no_message_even_when_data_is_accepted(
    system_clock, make_real_envelope
):
    """RFC 2920 3.1: a server may answer 354 to DATA although it refused the recipient.
    The client ends that DATA with an empty message, resets, and reports the refusal."""
    with _ScriptedServer(
        {"RCPT": ["550 5.1.1 no such user"], "END": ["554 no valid recipients"]}
    ) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.PERMANENT, 1)
    assert result.error == "SMTP 550 on RCPT TO: 5.1.1 no such user"
    assert server.bodies == [b""], server.lines
    assert b"RSET" in server.lines


@pytest.mark.parametrize(
    "reply",
    [
        "hello there",
        "250-sender ok\r\n550 5.1.0 no such sender",  # RFC 5321 4.2.1: one code per reply
        "\r\n".join(["250-" + "x" * 996] * 40) + "\r\n250 ok",  # 40 kB in all
    ],
    ids=["not-a-reply", "code-changes-within-a-reply", "longer-than-any-reply"],
)
def test_a_reply_that_is_not_smtp_fails_before_the_message_and_is_retried(
    system_clock, make_real_envelope, reply
):
    with _ScriptedServer({"MAIL": [reply]}) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert len(server.bodies) == 1


@pytest.mark.parametrize(
    "reply",
    ["hello there", "\r\n".join(["250-" + "x" * 996] * 40) + "\r\n250 ok"],
    ids=["not-a-reply", "longer-than-any-reply"],
)
def test_without_pipelining_a_reply_that_is_not_smtp_fails_before_the_message_and_is_retried(
    system_clock, make_real_envelope, reply
):
    with _ScriptedServer({"MAIL": [reply]}, pipelining=(False,)) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert len(server.bodies) == 1


def test_a_reply_the_server_sent_unasked_on_an_idle_connection_is_not_paired_with_a_command(
    system_clock, make_real_envelope
):
    """A 421 written after the first message's 250, the connection left open: the next
    send must not take it for its MAIL FROM's reply (every reply after it would go with
    the wrong command). The session ends and a new one carries the message, first try."""
    with _ScriptedServer({"END": ["250 accepted\r\n421 4.3.2 going away soon"]}) as server:
        results = run(
            deliver(
                [make_real_envelope(), make_real_envelope()],
                _scripted_channel(server, system_clock),
                policy=DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=3),
                clock=system_clock,
            )
        )
    assert [(r.outcome, r.attempts) for r in results] == [(Outcome.SENT, 1)] * 2
    assert len(server.bodies) == 2
    assert server.connections == 2


def test_a_session_that_ends_right_after_its_354_fails_before_the_message_and_is_retried(
    system_clock, make_real_envelope
):
    """The 354 and a line that is not a reply come in one packet: the session ends before
    the message's first byte is written, so the server cannot have it: a transient
    failure, sent again (not an unknown outcome, which would never be retried)."""
    with _ScriptedServer({"DATA": ["354 go ahead\r\nnonsense"]}) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert len(server.bodies) == 1


def test_a_reply_after_the_354_that_nobody_asked_for_is_not_taken_as_the_messages(
    system_clock, make_real_envelope
):
    """A stray 250 after the 354 would be read as the answer to the message, and the 451
    the server then gives the message would be lost: the session ends instead, before the
    message; the next try gets the 451 and the one after that is accepted."""
    with _ScriptedServer(
        {"DATA": ["354 go ahead\r\n250 bogus"], "END": ["451 4.3.0 try again later"]}
    ) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 3), result.error
    assert len(server.bodies) == 2  # the one refused with 451, then the one accepted


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelining", "no-pipelining"])
@pytest.mark.parametrize("reply", ["354 what now", "hello there"], ids=["a-354", "not-a-reply"])
def test_a_final_reply_that_is_neither_success_nor_refusal_leaves_the_outcome_unknown(
    system_clock, make_real_envelope, pipelining, reply
):
    with _ScriptedServer({"END": [reply]}, pipelining=(pipelining,)) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert result.maybe_delivered, result
    assert result.outcome is not Outcome.SENT and result.outcome is not Outcome.PERMANENT
    assert result.attempts == 1  # not sent again blind: smtp has no idempotency keys
    assert len(server.bodies) == 1


@pytest.mark.parametrize(
    ("later", "why"),
    [
        (b"421 4.3.2 going away soon\r\n", "unasked"),
        (b"421 " + b"x" * 40_000, "longer than any SMTP reply"),  # and no line end yet
    ],
    ids=["a-reply", "a-line-without-end"],
)
def test_a_pooled_session_ends_as_soon_as_the_server_speaks_unasked(
    system_clock, make_real_envelope, later, why
):
    """An idle pooled connection reads nothing into memory for later: the first reply
    nobody asked for closes it at once (a server talking to it cannot grow its buffer)."""

    async def scenario(channel):
        async with channel:
            await channel.send(make_real_envelope())
            [pooled] = channel._idle
            deadline = system_clock.monotonic() + 2.0
            while pooled.ended is None and system_clock.monotonic() < deadline:
                await system_clock.sleep(0.01)
            return pooled.ended, pooled.transport.is_closing()

    with _ScriptedServer({}, later=later) as server:
        ended, closing = run(scenario(_scripted_channel(server, system_clock)))
    assert ended is not None and why in ended, ended
    assert closing


def test_a_pause_while_the_connection_opens_sends_nothing_under_the_old_snapshot(
    smtp_sink, system_clock, make_real_envelope
):
    """C11: the engine cleared the call, then the process stopped (here: the event loop
    blocked 0.5 s while connecting, as SIGSTOP would) and its claim was withdrawn
    meanwhile. Awake, the channel's last look before MAIL FROM finds its snapshot older
    than the gate allows: nothing reaches the server, and the next try sees the
    withdrawal."""
    from delivery.gate import Gate

    envelope = make_real_envelope()
    channel = channel_for(smtp_sink, system_clock)
    gate = Gate(max_age=0.2, clock=system_clock)
    began = system_clock.monotonic()
    opened, paused = channel._open, []

    async def open_after_a_pause():
        paused.append(system_clock.monotonic() - began)
        system_clock.sleep_blocking(0.5)  # nothing runs: not the watch, not the engine
        return await opened()

    channel._open = open_after_a_pause

    async def watch():
        # What the worker's claim watch would read: withdrawn while the process was paused.
        while True:
            lost = {envelope.reminder_id: "the claim was lost"} if paused else {}
            gate.publish(lost, taken_at=system_clock.monotonic())
            await system_clock.sleep(0.05)

    async def scenario():
        task = asyncio.create_task(watch())
        try:
            return await deliver([envelope], channel, policy=QUICK, clock=system_clock, gate=gate)
        finally:
            task.cancel()

    [result] = run(scenario())

    assert len(paused) == 1, "the call was not cleared before the pause"
    assert smtp_sink.received() == []
    assert result.outcome is Outcome.WITHDRAWN
    assert result.provider_reached is False


async def _until(condition, clock, within: float = 2.0) -> None:
    deadline = clock.monotonic() + within
    while not condition() and clock.monotonic() < deadline:
        await clock.sleep(0.01)


def test_a_server_refusing_the_session_in_its_greeting_was_never_reached_and_is_retried(
    system_clock, make_real_envelope
):
    with _ScriptedServer({}, greeting="554 5.7.1 no service here") as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.provider_reached) == (Outcome.TRANSIENT, False)
    assert result.attempts == QUICK.max_attempts
    assert f"127.0.0.1:{server.port} refused the session (554): 5.7.1 no service here" in (
        result.error
    )


def test_a_pipelined_data_command_refused_with_4xx_is_retried_on_the_same_connection(
    system_clock, make_real_envelope
):
    with _ScriptedServer({"DATA": ["451 4.3.0 try again later"]}) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert (len(server.bodies), server.connections) == (1, 1)
    assert b"RSET" in server.lines


def test_a_refusal_is_reported_even_when_the_server_hangs_up_on_the_reset(
    system_clock, make_real_envelope
):
    with _ScriptedServer(
        {"RCPT": ["550 5.1.1 no such user"], "DATA": ["554 no recipients"], "RSET": ["CLOSE"]}
    ) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.PERMANENT, 1)
    assert result.error == "SMTP 550 on RCPT TO: 5.1.1 no such user"


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelining", "no-pipelining"])
def test_a_hang_up_after_the_message_leaves_the_outcome_unknown_and_is_not_sent_again(
    system_clock, make_real_envelope, pipelining
):
    with _ScriptedServer({"END": ["CLOSE"]}, pipelining=(pipelining,)) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.maybe_delivered, result.attempts) == (True, 1), result
    assert "failed during DATA; the server may have accepted the message" in result.error
    assert len(server.bodies) == 1


def test_without_pipelining_a_hang_up_before_the_message_is_retried_on_a_new_connection(
    system_clock, make_real_envelope
):
    """A fresh connection lost is not replaced within the try: only a pooled one is."""
    with _ScriptedServer({"MAIL": ["CLOSE"]}, pipelining=(False,)) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert (len(server.bodies), server.connections) == (1, 2)


def test_a_server_silent_after_the_message_past_the_timeout_leaves_the_outcome_unknown(
    smtp_sink, system_clock, make_real_envelope
):
    # The commands before DATA get 1 s each, so a loaded host does not time out there instead.
    smtp_sink.data_delay = 3.0
    channel = channel_for(smtp_sink, system_clock, timeout=1.0)

    [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

    assert (result.maybe_delivered, result.attempts) == (True, 1), result
    assert "failed during DATA; the server may have accepted the message" in result.error


def test_a_pooled_connection_holding_part_of_an_unasked_reply_is_not_used_again(
    system_clock, make_real_envelope
):
    """Those bytes would begin the next reply read on it: the next message takes a new one."""

    async def scenario(channel):
        async with channel:
            await channel.send(make_real_envelope())
            [pooled] = channel._idle
            await _until(lambda: not pooled.idle, system_clock)
            await channel.send(make_real_envelope())

    with _ScriptedServer({}, later=b"421 4.3.2 going") as server:
        run(scenario(_scripted_channel(server, system_clock)))
    assert (len(server.bodies), server.connections) == (2, 2)


def test_a_replacement_connection_without_pipelining_fails_the_message_before_it_is_sent(
    system_clock, make_real_envelope
):
    """The pooled connection ended; the new one no longer offers PIPELINING: the message is
    retried later, then sent one command at a time."""

    async def scenario(channel):
        async with channel:
            await channel.send(make_real_envelope())
            [pooled] = channel._idle
            await _until(lambda: pooled.ended is not None, system_clock)
            with pytest.raises(TransientError, match="no longer offers PIPELINING"):
                await channel.send(make_real_envelope())
            await channel.send(make_real_envelope())

    with _ScriptedServer({}, later=b"421 4.3.2 going away\r\n", pipelining=(True, False)) as server:
        run(scenario(_scripted_channel(server, system_clock)))
    assert (len(server.bodies), server.connections) == (2, 3)


@pytest.mark.parametrize(
    ("stall", "sent"), [(0.3, True), (3.0, False)], ids=["reads-late", "stops-reading"]
)
def test_a_server_slow_to_read_the_message_gets_it_unless_it_stops_past_the_timeout(
    system_clock, make_real_envelope, stall, sent
):
    """The message outgrows the socket buffers: the channel waits for the server to read,
    up to the timeout; past it the outcome is unknown (part of the message went out)."""
    envelope = make_real_envelope(text_body="See you there.\n" * 400_000)  # 6 MB
    with _ScriptedServer({}, stall=stall) as server:
        channel = SmtpChannel(
            SmtpSettings(
                host="127.0.0.1", port=server.port, from_email=FROM, timeout=1, starttls=False
            ),
            clock=system_clock,
        )
        [result] = run(deliver([envelope], channel, policy=QUICK, clock=system_clock))
    if sent:
        assert (result.outcome, result.attempts) == (Outcome.SENT, 1), result.error
    else:
        assert (result.maybe_delivered, result.attempts) == (True, 1), result
        assert "the server stopped reading within the timeout" in result.error


def _smtplib_error(port: int, login: tuple[str, str] | None = None) -> Exception:
    """What a blocking sender (Django's backend) raises sending one message to ``port``."""
    try:
        with smtplib.SMTP("127.0.0.1", port, timeout=5) as client:
            if login:
                client.login(*login)
            client.sendmail("r@example.org", ["ada@example.com"], b"Subject: hi\r\n\r\nx")
    except Exception as exc:
        return exc
    raise AssertionError("the message was sent")


@pytest.mark.parametrize(
    ("script", "error", "text"),
    [
        (
            {"greeting": "554 5.7.1 no service here"},
            TransientError,
            "SMTP server refused the session (554): 5.7.1 no service here",
        ),
        (
            {"replies": {"EHLO": ["554 5.7.1 go away"], "HELO": ["554 5.7.1 go away"]}},
            TransientError,
            "SMTP server refused the session (554): 5.7.1 go away",
        ),
        (
            {"replies": {"MAIL": ["550 5.7.1 not from you"]}},
            PermanentError,
            "SMTP 550 on MAIL FROM: 5.7.1 not from you",
        ),
        ({"replies": {"END": ["554 5.7.1 spam"]}}, PermanentError, "SMTP 554 on DATA: 5.7.1 spam"),
        ({"replies": {"END": ["CLOSE"]}}, OutcomeUnknownError, "SMTP connection lost: "),
        (
            {"replies": {"END": ["354 what now"]}},
            OutcomeUnknownError,
            "SMTP 354 on DATA, neither success nor refusal: what now",
        ),
        (
            {"replies": {"END": ["hello there"]}},
            OutcomeUnknownError,
            "SMTP -1 on DATA, neither success nor refusal: ",
        ),
    ],
    ids=[
        "greeting-refused",
        "greeting-answered-but-ehlo-and-helo-refused",
        "sender-refused",
        "message-refused",
        "lost-after-the-message",
        "a-354-after-the-message",
        "not-a-reply-after-the-message",
    ],
)
def test_smtplib_errors_map_to_the_delivery_error_of_their_phase(script, error, text):
    with _ScriptedServer(script.pop("replies", {}), **script) as server:
        translated = translate_smtplib_error(_smtplib_error(server.port))
    assert type(translated) is error
    assert str(translated).startswith(text)
    assert translated.reached is (error is not TransientError)


def test_smtplib_login_refused_fails_permanently_and_others_pass_through_unchanged():
    with SmtpSink(credentials=("mailer", "secret")) as sink:
        refused = translate_smtplib_error(_smtplib_error(sink.port, ("mailer", "wrong")))
    assert (type(refused), refused.reached) == (PermanentError, False)
    assert str(refused).startswith("SMTP login refused (535): ")
    assert str(refused).endswith("check the username and password")
    with _ScriptedServer({}) as server:  # offers no AUTH
        unsupported = _smtplib_error(server.port, ("mailer", "secret"))
    assert translate_smtplib_error(unsupported) is unsupported


@pytest.mark.parametrize("verb", ["EHLO", "MAIL"])
def test_a_call_cancelled_by_its_timeout_closes_its_connection(
    system_clock, make_real_envelope, verb
):
    """The engine's call timeout cancels the send while the server is slow to answer,
    opening the connection or in the envelope: the connection is closed then, not left
    open until the collector (disabled here) or the process ends."""
    policy = DeliveryLimits(call_timeout=0.3, max_attempts=1)
    gc.disable()
    try:
        with _ScriptedServer({}, slow={verb: 1.0}) as server:
            channel = _scripted_channel(server, system_clock)
            [result] = run(
                deliver([make_real_envelope()], channel, policy=policy, clock=system_clock)
            )
            _assert_all_closed(server, system_clock)
    finally:
        gc.enable()
    assert result.outcome is Outcome.TIMED_OUT


@pytest.mark.parametrize(
    "ehlo",
    ["CLOSE", "250-scripted\r\n250-PIPELINING\r\n250 HELP\r\nCLOSE"],
    ids=["before-answering-ehlo", "right-after-offering-pipelining"],
)
def test_a_server_hanging_up_during_set_up_was_never_reached_and_is_retried(
    system_clock, make_real_envelope, ehlo
):
    """The server hangs up instead of answering EHLO, or answers it (offering PIPELINING)
    and hangs up in the same segment: no command of the message went out, so the server
    cannot have it; the failure is transient and the provider not reached (safe to retry)."""
    with _ScriptedServer({"EHLO": [ehlo] * QUICK.max_attempts}) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.provider_reached, result.maybe_delivered) == (
        Outcome.TRANSIENT,
        False,
        False,
    ), result.error
    assert result.attempts == QUICK.max_attempts
    assert [line for line in server.lines if line.startswith(b"MAIL")] == []


def test_a_batch_cancelled_while_saying_goodbye_closes_every_pooled_connection(
    system_clock, make_real_envelope
):
    """The batch ends with two connections pooled; the server is slow to answer the first
    QUIT and the batch is cancelled meanwhile: the second, never sent QUIT, is closed too,
    not left open until the collector (disabled here) or the process ends."""
    envelopes = [make_real_envelope(), make_real_envelope()]

    async def batch(channel):
        async with channel:
            await asyncio.gather(*(channel.send(envelope) for envelope in envelopes))
            assert len(channel._idle) == 2

    async def scenario(channel):
        task = asyncio.create_task(batch(channel))
        await _until(lambda: b"QUIT" in server.lines, system_clock)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    gc.disable()
    try:
        with _ScriptedServer({}, slow={"QUIT": 1.0}) as server:
            channel = SmtpChannel(
                SmtpSettings(
                    host="127.0.0.1", port=server.port, from_email=FROM, timeout=5,
                    starttls=False, max_connections=2,
                ),
                clock=system_clock,
            )  # fmt: skip
            run(scenario(channel))
            assert (len(server.bodies), server.connections, server.lines.count(b"QUIT")) == (
                2,
                2,
                1,
            )
            _assert_all_closed(server, system_clock)
    finally:
        gc.enable()


def test_a_connection_whose_reset_is_refused_is_closed_and_the_next_message_takes_a_new_one(
    system_clock, make_real_envelope
):
    """The refused transaction may still be open on the server (its next MAIL FROM would
    get 503): only a connection whose RSET got 250 goes back to the pool."""
    with _ScriptedServer(
        {
            "RCPT": ["550 5.1.1 no such user"],
            "DATA": ["554 no valid recipients"],
            "RSET": ["421 4.3.0 cannot reset now"],
        }
    ) as server:
        results = run(
            deliver(
                [make_real_envelope(), make_real_envelope()],
                _scripted_channel(server, system_clock),
                policy=DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1),
                clock=system_clock,
            )
        )
    assert [r.outcome for r in results] == [Outcome.PERMANENT, Outcome.SENT], results
    assert (len(server.bodies), server.connections) == (1, 2)


def test_a_server_that_stops_reading_the_message_and_hangs_up_ends_the_send_at_once(
    system_clock, make_real_envelope
):
    """The channel waits for the server to read the message (it outgrows the socket
    buffers); the server drops the connection instead: the wait ends then, with the
    outcome unknown, not at the channel's 10 s timeout or the call's."""
    envelope = make_real_envelope(text_body="See you there.\n" * 400_000)  # 6 MB
    policy = DeliveryLimits(call_timeout=20, max_attempts=3)
    with _ScriptedServer({}, stall=0.3, hang_up_in_data=True) as server:
        channel = SmtpChannel(
            SmtpSettings(
                host="127.0.0.1", port=server.port, from_email=FROM, timeout=10, starttls=False
            ),
            clock=system_clock,
        )
        began = system_clock.monotonic()
        [result] = run(deliver([envelope], channel, policy=policy, clock=system_clock))
        elapsed = system_clock.monotonic() - began
    assert (result.maybe_delivered, result.attempts) == (True, 1), result
    assert "failed during DATA; the server may have accepted the message" in result.error
    assert elapsed < 5.0, f"the send waited {elapsed:.1f}s for a connection already gone"


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelining", "no-pipelining"])
@pytest.mark.parametrize("reply", ["CLOSE", "hello there"], ids=["hang-up", "not-a-reply"])
def test_a_session_lost_before_the_354_fails_before_the_message_and_is_retried(
    system_clock, make_real_envelope, pipelining, reply
):
    """The server hangs up, or answers what is no SMTP reply, instead of the 354 to DATA: not
    a byte of the message was written, so the server cannot have it. A transient failure,
    sent again on a new connection, not an unknown outcome that is never retried."""
    with _ScriptedServer({"DATA": [reply]}, pipelining=(pipelining,)) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts, result.maybe_delivered) == (
        Outcome.SENT,
        2,
        True,
    ), result.error
    assert (len(server.bodies), server.connections) == (1, 2)


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelining", "no-pipelining"])
@pytest.mark.parametrize(
    "reply", ["452 4.5.3 Too many recipients", "552 5.5.3 Too many recipients"]
)
def test_too_many_recipients_in_reply_to_rcpt_is_retried_whether_452_or_552(
    system_clock, make_real_envelope, pipelining, reply
):
    """RFC 5321 4.5.3.1.10: the limit on recipients is 452, but servers following RFC 821
    answer 552, which a client should take as 452 (Postfix does): not a refusal of the
    address, and reachable with one recipient a message on a session that carried many."""
    with _ScriptedServer({"RCPT": [reply]}, pipelining=(pipelining,)) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert len([body for body in server.bodies if body]) == 1  # the refused DATA ends empty


def test_a_blocking_sender_told_552_for_its_recipient_gets_a_transient_failure():
    with _ScriptedServer({"RCPT": ["552 5.5.3 Too many recipients"]}) as server:
        translated = translate_smtplib_error(_smtplib_error(server.port))
    assert (type(translated), translated.reached) == (TransientError, True)
    assert str(translated).startswith("SMTP 552 on RCPT TO: 5.5.3 Too many recipients")


def test_a_pause_while_a_dropped_connection_is_replaced_sends_nothing_under_the_old_snapshot(
    smtp_sink, system_clock, make_real_envelope
):
    """C11 on the replacement of a pooled connection the server dropped: the engine cleared
    the second message, its pooled connection was gone, and the process stopped (the loop
    blocked 0.5 s) while the new one opened; its claim was withdrawn meanwhile. The last look
    before the new connection's first command finds the snapshot stale: the message is not
    sent, and the next try sees the withdrawal."""
    from delivery.gate import Gate

    first, second = make_real_envelope(), make_real_envelope()
    channel = channel_for(smtp_sink, system_clock)
    gate = Gate(max_age=0.2, clock=system_clock)
    connect, send, paused = channel._connect, channel.send, []

    async def connect_after_a_pause():
        if smtp_sink.connections_opened:  # the replacement
            paused.append(system_clock.monotonic())
            system_clock.sleep_blocking(0.5)  # nothing runs: not the watch, not the engine
        return await connect()

    async def send_on_a_dropped_connection(envelope):
        if envelope is second:
            assert smtp_sink.drop_connections() == 1
            await system_clock.sleep(0.1)  # the client sees the connection closed
        return await send(envelope)

    channel._connect = connect_after_a_pause
    channel.send = send_on_a_dropped_connection

    async def watch():
        while True:
            lost = {second.reminder_id: "the claim was lost"} if paused else {}
            gate.publish(lost, taken_at=system_clock.monotonic())
            await system_clock.sleep(0.05)

    async def scenario():
        task = asyncio.create_task(watch())
        try:
            policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=3)
            return await deliver(
                [first, second], channel, policy=policy, clock=system_clock, gate=gate
            )
        finally:
            task.cancel()

    results = run(scenario())

    assert len(paused) == 1, "the connection was not replaced"
    assert [r.outcome for r in results] == [Outcome.SENT, Outcome.WITHDRAWN], results
    assert len(smtp_sink.received()) == 1
    assert results[1].provider_reached is False


_OFFERS_AUTH = "250-scripted\r\n250-AUTH PLAIN\r\n250 HELP"


def test_a_temporary_authentication_failure_is_retried_not_taken_for_a_wrong_password(
    system_clock, make_real_envelope
):
    """RFC 4954 6: 454 4.7.0 to AUTH is a temporary server failure (its password store
    unreachable, say): the login is tried again later, the reminder not failed for good."""
    script = {
        "EHLO": [_OFFERS_AUTH] * 2,
        "AUTH": ["454 4.7.0 Temporary authentication failure", "235 2.7.0 Accepted"],
    }
    with _ScriptedServer(script) as server:
        channel = SmtpChannel(
            SmtpSettings(
                host="127.0.0.1", port=server.port, from_email=FROM, timeout=5, starttls=False,
                username="mailer", password="secret", allow_plaintext_auth=True,
            ),
            clock=system_clock,
        )  # fmt: skip
        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))
    assert (result.outcome, result.attempts) == (Outcome.SENT, 2), result.error
    assert len(server.bodies) == 1


def test_a_blocking_senders_temporary_authentication_failure_is_transient():
    script = {"EHLO": [_OFFERS_AUTH], "AUTH": ["454 4.7.0 Temporary authentication failure"]}
    with _ScriptedServer(script) as server:
        translated = translate_smtplib_error(_smtplib_error(server.port, ("mailer", "secret")))
    assert (type(translated), translated.reached) == (TransientError, False)
    assert "454" in str(translated) and "Temporary authentication failure" in str(translated)


def test_a_server_refusing_ehlo_and_helo_refused_the_session_and_is_retried(
    system_clock, make_real_envelope
):
    """As a 554 greeting: the session is refused before MAIL FROM, not the sender."""
    refusals = ["554 5.7.1 go away"] * 2 * QUICK.max_attempts
    with _ScriptedServer({"EHLO": refusals, "HELO": refusals}) as server:
        result = _one_through(server, system_clock, make_real_envelope())
    assert (result.outcome, result.provider_reached) == (Outcome.TRANSIENT, False), result.error
    assert result.attempts == QUICK.max_attempts
    assert f"127.0.0.1:{server.port} refused the session (554): 5.7.1 go away" in result.error
    assert [line for line in server.lines if line.startswith(b"MAIL")] == []
