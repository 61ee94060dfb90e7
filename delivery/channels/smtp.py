"""Send through an SMTP server with aiosmtplib, pooling connections within a batch.

4xx is transient, 5xx permanent (but 552 to RCPT TO, as RFC 5321 4.5.3.1.10 says); a failure
in DATA has an unknown outcome, never retried (no idempotency keys). A connection cancelled or failed mid-transaction is never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import smtplib
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Self

import aiosmtplib

from clock import Clock
from delivery.addresses import is_loopback_host
from delivery.dkim import DkimKey, dkim_sign
from delivery.envelope import Envelope
from delivery.errors import OutcomeUnknownError, PermanentError, TransientError
from delivery.gate import last_look
from delivery.message import Sender, message_id_for, parse_sender, write_message

__all__ = ["SmtpSettings", "SmtpChannel", "plaintext_smtp_allowed", "translate_smtplib_error"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpSettings:
    """Where and how to connect, e.g. from Django's EMAIL_* settings.

    ``use_tls`` is implicit TLS; ``starttls`` None upgrades whenever offered, True requires it,
    False never. ``require_tls`` refuses, before sending, a session left unencrypted (no
    STARTTLS offered, or the offer stripped on the way); ``plaintext_smtp_allowed`` says for
    which hosts it may be False. No password goes without TLS unless ``allow_plaintext_auth``.
    """

    host: str
    from_email: str
    port: int = 25
    username: str = ""
    password: str = field(default="", repr=False)
    use_tls: bool = False
    starttls: bool | None = None
    require_tls: bool = False
    allow_plaintext_auth: bool = False
    timeout: float = 10.0
    max_connections: int = 1
    validate_certs: bool = True
    #: Sign every message with it (delivery/dkim.py); None: the relay signs, or nobody.
    dkim: DkimKey | None = None

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("SmtpSettings.host is empty; pass the SMTP server (EMAIL_HOST).")
        if not 0 < self.port < 65536:
            raise ValueError(f"SmtpSettings.port must be 1-65535 (got {self.port!r}).")
        if self.use_tls and self.starttls:
            raise ValueError(
                "SmtpSettings.use_tls and starttls are mutually exclusive; use_tls for port 465, "
                "starttls for port 587."
            )
        if self.require_tls and self.starttls is False and not self.use_tls:
            raise ValueError(
                "SmtpSettings.require_tls needs TLS, but starttls=False never upgrades; set "
                "use_tls (implicit TLS) or leave starttls None or True."
            )
        if bool(self.username) != bool(self.password):
            raise ValueError(
                "SmtpSettings needs both username and password, or neither (no authentication)."
            )
        if not (isinstance(self.timeout, int | float) and 0 < self.timeout < math.inf):
            raise ValueError(f"SmtpSettings.timeout must be seconds > 0 (got {self.timeout!r}).")
        if not isinstance(self.max_connections, int) or self.max_connections < 1:
            raise ValueError(
                f"SmtpSettings.max_connections must be >= 1 (got {self.max_connections!r})."
            )
        parse_sender(self.from_email, setting="SmtpSettings.from_email")


def plaintext_smtp_allowed(host: str, plaintext_hosts: Iterable[str] = ()) -> bool:
    """Return True if SMTP to ``host`` may stay unencrypted: a loopback host or one listed."""
    name = _host_name(host)
    if not name:
        return False
    return is_loopback_host(name) or name in {_host_name(listed) for listed in plaintext_hosts}


def _host_name(host: str) -> str:
    return host.strip().rstrip(".").lower()


def _from_reply(code: int, text: str, what: str) -> TransientError | PermanentError:
    message = f"SMTP {code} on {what}: {text.strip()}"
    # RFC 5321 4.5.3.1.10: a 552 to RCPT TO is RFC 821's "too many recipients", to take as 452.
    if 400 <= code < 500 or (code == 552 and what == "RCPT TO"):
        return TransientError(message)
    return PermanentError(message)


def _neither_reply(code: int, text: str) -> OutcomeUnknownError:
    """A reply in DATA that is neither success nor refusal: perhaps the message's answer."""
    return OutcomeUnknownError(
        f"SMTP {code} on DATA, neither success nor refusal: {text.strip()}; "
        "the server may have accepted the message"
    )


# RFC 5321 4.5.2: dot-stuffing.
_LEADING_PERIOD = re.compile(rb"(?m)^\.")
# Longer than any real SMTP reply, all its lines together.
_MAX_REPLY_BYTES = 32 * 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _ReplyError(Exception):
    """The session ended, timed out or sent something that is not an SMTP reply."""


class _Pipeline(asyncio.Protocol):
    """A pipelined SMTP session after set-up (aiosmtplib drops unawaited replies).

    Any reply not owed, malformed or late ends it; then ``reply``/``write`` raise ``_ReplyError``.
    """

    def __init__(self, transport: asyncio.Transport, *, timeout: float, clock: Clock) -> None:
        self.transport = transport
        self._timeout = timeout
        self._clock = clock
        self._buffer = bytearray()
        self._lines: list[str] = []
        self._code = b""
        self._size = 0
        self._owed = 0  # replies still due for the commands written
        self._replies: deque[tuple[int, str]] = deque()
        self._arrived: asyncio.Event = asyncio.Event()
        self._writable: asyncio.Event = asyncio.Event()
        self._writable.set()
        self.ended: str | None = None
        transport.set_protocol(self)

    def data_received(self, data: bytes) -> None:
        if self.ended is not None:
            return
        self._buffer += data
        while (end := self._buffer.find(b"\n")) != -1:
            line = bytes(self._buffer[: end + 1]).rstrip(b"\r\n")
            del self._buffer[: end + 1]
            code = line[:3]
            if not code.isdigit() or line[3:4] not in (b"", b" ", b"-"):
                self._end(f"the server sent a line that is not an SMTP reply: {line[:80]!r}")
                return
            if self._lines and code != self._code:  # RFC 5321 4.2.1: one code per reply
                self._end(f"the server changed the code within a reply: {line[:80]!r}")
                return
            self._code, self._size = code, self._size + len(line)
            if self._size > _MAX_REPLY_BYTES:
                self._end("the server sent a reply longer than any SMTP reply")
                return
            self._lines.append(line[4:].decode("utf-8", "replace"))
            if line[3:4] == b"-":
                continue
            reply = (int(code), "\n".join(self._lines))
            self._lines, self._size = [], 0
            if self._owed == 0:
                self._end(f"the server said {reply[0]} {reply[1]!r} unasked")
                return
            self._owed -= 1
            self._replies.append(reply)
            self._arrived.set()
        if len(self._buffer) > _MAX_REPLY_BYTES:
            self._end("the server sent a reply longer than any SMTP reply")

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(f"connection lost: {exc}" if exc else "the server closed the connection")
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _end(self, why: str) -> None:
        if self.ended is None:
            self.ended = why
            self.transport.close()
        self._arrived.set()

    @property
    def idle(self) -> bool:
        """Return True when open with nothing owed or unread, ready for a transaction."""
        return (
            self.ended is None
            and self._owed == 0
            and not self._replies
            and not self._lines
            and not self._buffer
        )

    async def write(self, data: bytes, *, replies: int) -> None:
        """Write commands that ask for ``replies`` replies in all."""
        if self.ended is not None:
            raise _ReplyError(self.ended)
        self._owed += replies
        self.transport.write(data)
        if not self._writable.is_set():
            try:
                async with self._clock.timeout(self._timeout):
                    await self._writable.wait()
            except TimeoutError:
                self._end("the server stopped reading within the timeout")
        if self.ended is not None:
            raise _ReplyError(self.ended)

    async def reply(self) -> tuple[int, str]:
        while not self._replies:
            if self.ended is not None:
                raise _ReplyError(self.ended)
            self._arrived.clear()
            try:
                async with self._clock.timeout(self._timeout):
                    await self._arrived.wait()
            except TimeoutError:
                self._end(f"no reply within {self._timeout:g}s")
                raise _ReplyError(self.ended) from None
        return self._replies.popleft()

    async def quit(self) -> None:
        with contextlib.suppress(_ReplyError):
            await self.write(b"QUIT\r\n", replies=1)
            await self.reply()
        self.close()

    def close(self) -> None:
        self._end("closed by the client")


class SmtpChannel:
    """Deliver envelopes as email through one SMTP server."""

    name = "smtp"
    honours_idempotency_keys = False

    def __init__(self, settings: SmtpSettings, *, clock: Clock) -> None:
        self.settings = settings
        # The engine runs at most this many sends at once, each on a connection of its own.
        self.max_concurrency = settings.max_connections
        self._clock = clock
        self._sender: Sender = parse_sender(settings.from_email, setting="SmtpSettings.from_email")
        self._idle: list[aiosmtplib.SMTP | _Pipeline] = []

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info) -> None:
        idle, self._idle = self._idle, []
        try:
            for connection in idle:
                with contextlib.suppress(aiosmtplib.SMTPException, OSError):
                    await connection.quit()
        finally:
            for connection in idle:  # if cancelled, close the rest without QUIT
                connection.close()

    async def _open(self) -> aiosmtplib.SMTP | _Pipeline:
        """Connect, pipelining when the server offers PIPELINING."""
        connection = await self._connect()
        if not connection.supports_extension("pipelining"):
            return connection
        transport = connection.transport
        if transport is None or transport.is_closing():
            connection.close()
            raise TransientError(
                f"SMTP connection to {self.settings.host} closed before the message was sent: "
                "the connection closed during its set-up",
                reached=False,
            )
        return _Pipeline(transport, timeout=self.settings.timeout, clock=self._clock)

    async def _connect(self) -> aiosmtplib.SMTP:
        settings = self.settings
        # No credentials here: we log in ourselves, after checking for TLS. STARTTLS
        # whenever offered; where it is required, _refuse_plaintext_session checks it.
        connection = aiosmtplib.SMTP(
            hostname=settings.host,
            port=settings.port,
            use_tls=settings.use_tls,
            start_tls=False if settings.starttls is False else None,
            timeout=settings.timeout,
            validate_certs=settings.validate_certs,
        )
        try:
            await connection.connect()
            if settings.require_tls or settings.starttls:
                self._refuse_plaintext_session(connection)
            if settings.username:
                self._refuse_plaintext_login(connection)
                await connection.login(settings.username, settings.password)
            if connection.is_ehlo_or_helo_needed:
                # EHLO tells whether to pipeline; aiosmtplib falls back to HELO later.
                with contextlib.suppress(aiosmtplib.SMTPHeloError):
                    await connection.ehlo()
        except asyncio.CancelledError:
            connection.close()
            raise
        except aiosmtplib.SMTPAuthenticationError as exc:
            connection.close()
            if 400 <= exc.code < 500:  # RFC 4954 6: 454 4.7.0, a temporary server failure
                raise TransientError(
                    f"SMTP login to {settings.host} failed for now ({exc.code}): {exc.message}",
                    reached=False,
                ) from exc
            raise PermanentError(
                f"SMTP login to {settings.host} refused ({exc.code}): {exc.message}; "
                "check the username and password",
                reached=False,
            ) from exc
        except aiosmtplib.SMTPResponseException as exc:
            connection.close()
            raise TransientError(
                f"SMTP server {settings.host}:{settings.port} refused the session "
                f"({exc.code}): {exc.message}",
                reached=False,
            ) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            connection.close()
            raise TransientError(
                f"could not connect to SMTP server {settings.host}:{settings.port}: {exc}",
                reached=False,
            ) from exc
        return connection

    def _refuse_plaintext_session(self, connection: aiosmtplib.SMTP) -> None:
        """Refuse an unencrypted session where TLS is required, before anything is sent on it.

        Transient: the server may gain STARTTLS, or a man in the middle stripping it may go away.
        """
        if connection.get_transport_info("sslcontext") is not None:
            return
        connection.close()
        host, port = self.settings.host, self.settings.port
        raise TransientError(
            f"SMTP server {host}:{port} offers no STARTTLS, so the message would cross the "
            "network in clear text (or someone on the way removed the offer); nothing was "
            "sent. Enable STARTTLS on the server and set EMAIL_USE_TLS=1, or use implicit "
            "TLS (EMAIL_USE_SSL=1); for a relay on a trusted private network only, list "
            f"{host} in EMAIL_PLAINTEXT_HOSTS and leave EMAIL_USE_TLS unset",
            reached=False,
        )

    def _refuse_plaintext_login(self, connection: aiosmtplib.SMTP) -> None:
        encrypted = connection.get_transport_info("sslcontext") is not None
        if encrypted or self.settings.allow_plaintext_auth:
            return
        connection.close()
        raise PermanentError(
            f"SMTP server {self.settings.host}:{self.settings.port} offers no TLS, so the "
            "password would cross the network in clear text; nothing was sent. Enable "
            "STARTTLS on the server, use implicit TLS (EMAIL_USE_SSL=1), or, for a relay on "
            "a trusted network only, set EMAIL_ALLOW_PLAINTEXT_AUTH=1",
            reached=False,
        )

    async def send(self, envelope: Envelope) -> str:
        message = write_message(envelope, sender=self._sender, date=self._clock.now())
        # The engine refuses such an address first; the commands refuse it themselves.
        if _CONTROL.search(message.recipient):  # the sender's was refused at construction
            raise PermanentError(
                f"address {message.recipient!r} holds a control character", reached=False
            )
        data = message.data
        if self.settings.dkim is not None:
            data = dkim_sign(data, self.settings.dkim)
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._open()
        try:
            last_look()  # opening it may have taken long: a pause, a slow server
        except TransientError:
            self._idle.append(connection)  # nothing of this message was written on it
            raise
        if isinstance(connection, _Pipeline):
            await self._send_pipelined(connection, reused, message.recipient, data)
        else:
            await self._send_unpipelined(connection, reused, message.recipient, data)
        return message_id_for(envelope.key, self._sender.domain)

    async def _send_unpipelined(
        self, connection: aiosmtplib.SMTP, reused: bool, recipient: str, data: bytes
    ) -> None:
        """Run one transaction with aiosmtplib, a round trip per command."""
        reusable = False
        try:
            try:
                await self._envelope_commands(connection, recipient)
            except aiosmtplib.SMTPServerDisconnected:
                if not reused:
                    raise
                # A dropped idle connection is replaced once.
                logger.info("SMTP connection to %s was dropped; reconnecting", self.settings.host)
                connection.close()
                connection = await self._connect()
                last_look()  # opening it may have taken long, as in send
                await self._envelope_commands(connection, recipient)
            await self._data(connection, data)
            reusable = True
        except (aiosmtplib.SMTPException, OSError) as exc:
            # Before DATA (``_data`` translates its own errors): not accepted.
            if isinstance(exc, aiosmtplib.SMTPHeloError):  # EHLO and HELO refused: no MAIL FROM
                raise TransientError(
                    f"SMTP server {self.settings.host}:{self.settings.port} refused the session "
                    f"({exc.code}): {exc.message}",
                    reached=False,
                ) from exc
            if (
                isinstance(exc, aiosmtplib.SMTPResponseException)
                and exc.code != aiosmtplib.SMTPStatus.invalid_response  # a line that is no reply
            ):
                # End the refused transaction; the connection is reused if RSET goes through.
                with contextlib.suppress(aiosmtplib.SMTPException, OSError):
                    await connection.rset()
                    reusable = True
                command = (
                    "RCPT TO" if isinstance(exc, aiosmtplib.SMTPRecipientRefused) else "MAIL FROM"
                )
                raise _from_reply(exc.code, exc.message, command) from exc
            raise self._failed_before_data(exc) from exc
        finally:
            if reusable:
                self._idle.append(connection)
            else:
                connection.close()

    async def _send_pipelined(
        self, connection: _Pipeline, reused: bool, recipient: str, data: bytes
    ) -> None:
        """Run one transaction in two round trips; without the final reply the outcome is unknown."""
        try:
            try:
                replies = await self._pipelined_envelope(connection, recipient)
            except _ReplyError:
                if not reused:
                    raise
                # A dropped idle connection is replaced once.
                logger.info("SMTP connection to %s was dropped; reconnecting", self.settings.host)
                connection.close()
                replacement = await self._open()
                if not isinstance(replacement, _Pipeline):
                    replacement.close()
                    raise _ReplyError("the server no longer offers PIPELINING") from None
                connection = replacement
                last_look()  # opening it may have taken long, as in send
                replies = await self._pipelined_envelope(connection, recipient)
            (mail, mail_text), (rcpt, rcpt_text), (start, start_text) = replies
            if mail != 250:
                refused = _from_reply(mail, mail_text, "MAIL FROM")
            elif rcpt not in (250, 251):
                refused = _from_reply(rcpt, rcpt_text, "RCPT TO")
            elif start != 354:
                refused = _from_reply(start, start_text, "DATA")
            else:
                refused = None
            if refused is not None:
                await self._abandon(connection, data_accepted=start == 354)
            elif not connection.idle:
                raise _ReplyError(connection.ended or "the server sent more than was asked")
        except _ReplyError as exc:
            # Only the envelope was written: the server cannot have the message.
            connection.close()
            raise self._failed_before_data(exc) from exc
        except BaseException:
            connection.close()
            raise
        if refused is not None:
            raise refused
        try:
            # write_message ends every message with CRLF.
            body = _LEADING_PERIOD.sub(b"..", data)
            await connection.write(body + b".\r\n", replies=1)
            code, text = await connection.reply()
        except _ReplyError as exc:
            connection.close()
            raise self._failed_during_data(exc) from exc
        except BaseException:
            connection.close()
            raise
        if 200 <= code < 300:
            self._idle.append(connection)
            return
        if 400 <= code < 600:
            # A definite refusal: the transaction is over, the connection reusable.
            self._idle.append(connection)
            raise _from_reply(code, text, "DATA")
        connection.close()
        raise OutcomeUnknownError(
            f"SMTP {code} on DATA, not a reply to the end of a message: {text.strip()}; the "
            "server may have accepted it"
        )

    def _failed_before_data(self, exc: Exception) -> TransientError:
        return TransientError(
            f"SMTP connection to {self.settings.host} failed before the message was sent: {exc}"
        )

    def _failed_during_data(self, exc: Exception) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"SMTP connection to {self.settings.host} failed during DATA; the server may "
            f"have accepted the message: {exc}"
        )

    async def _pipelined_envelope(
        self, connection: _Pipeline, recipient: str
    ) -> list[tuple[int, str]]:
        if not connection.idle:
            raise _ReplyError(connection.ended or "the server sent a reply nobody asked for")
        await connection.write(
            f"MAIL FROM:<{self._sender.address}>\r\nRCPT TO:<{recipient}>\r\nDATA\r\n".encode(
                "ascii"
            ),
            replies=3,
        )
        return [await connection.reply() for _ in range(3)]

    async def _abandon(self, connection: _Pipeline, *, data_accepted: bool) -> None:
        """End a refused transaction; pool the connection if the server reset it."""
        try:
            if data_accepted:
                # RFC 2920 3.1: DATA accepted without a valid recipient; end it empty.
                await connection.write(b".\r\n", replies=1)
                await connection.reply()
            await connection.write(b"RSET\r\n", replies=1)
            code, _ = await connection.reply()
        except _ReplyError:
            connection.close()
            return
        if code == 250:
            self._idle.append(connection)
        else:
            connection.close()

    async def _envelope_commands(self, connection: aiosmtplib.SMTP, recipient: str) -> None:
        await connection.mail(self._sender.address)
        await connection.rcpt(recipient)

    async def _data(self, connection: aiosmtplib.SMTP, data: bytes) -> None:
        # DATA apart from the message (aiosmtplib's data() sends both): a session lost before
        # the 354 has not a byte of the message, so it is retried, as on the pipelined path.
        try:
            code, text = await connection.execute_command(b"DATA")
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise self._failed_before_data(exc) from exc
        if code != aiosmtplib.SMTPStatus.start_input:
            if 400 <= code < 600:
                raise _from_reply(code, text, "DATA")
            raise self._failed_before_data(
                _ReplyError(f"SMTP {code} to DATA, not 354: {text.strip()}")
            )
        try:
            protocol = connection.protocol
            if protocol is None:
                raise aiosmtplib.SMTPServerDisconnected("Connection lost")
            # write_message ends every message with CRLF.
            protocol.write(_LEADING_PERIOD.sub(b"..", data) + b".\r\n")
            code, text = await protocol.read_response(timeout=self.settings.timeout)
        except aiosmtplib.SMTPResponseException as exc:  # a line that is no reply
            raise _neither_reply(exc.code, exc.message) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise self._failed_during_data(exc) from exc
        if code == aiosmtplib.SMTPStatus.completed:
            return
        if 400 <= code < 600:
            raise _from_reply(code, text, "DATA")
        raise _neither_reply(code, text)  # a 354


def translate_smtplib_error(
    exc: BaseException, *, opening: bool = False, before_data: bool = False
) -> BaseException:
    """Map an ``smtplib``/socket error to a delivery error; return others unchanged.

    For blocking senders under ``ThreadedChannel``: otherwise every ``smtplib``
    error is an ``OSError`` and a refused recipient looks like a lost connection.
    ``opening``: raised while the session was opened (connect, STARTTLS, login), before any
    command of the message, so a TLS or connection failure there cannot have delivered it;
    ``before_data``: raised before DATA was sent, so a lost connection cannot have either.
    """
    if isinstance(exc, smtplib.SMTPAuthenticationError) and 400 <= exc.smtp_code < 500:
        return TransientError(  # RFC 4954 6: 454 4.7.0, a temporary server failure
            f"SMTP login failed for now ({exc.smtp_code}): {_text(exc.smtp_error)}",
            reached=False,
        )
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return PermanentError(
            f"SMTP login refused ({exc.smtp_code}): {_text(exc.smtp_error)}; "
            "check the username and password",
            reached=False,
        )
    if isinstance(exc, smtplib.SMTPConnectError | smtplib.SMTPHeloError):
        return TransientError(
            f"SMTP server refused the session ({exc.smtp_code}): {_text(exc.smtp_error)}",
            reached=False,
        )
    if opening and isinstance(exc, OSError):
        if isinstance(exc, smtplib.SMTPResponseException):
            detail = f"the server answered {exc.smtp_code} {_text(exc.smtp_error)}"
        else:
            detail = f"{type(exc).__name__}: {exc}"
        return TransientError(
            f"could not open the SMTP session, so it failed before the message was sent: {detail}",
            reached=False,
        )
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        for code, text in exc.recipients.values():
            return _from_reply(code, _text(text), "RCPT TO")
    if isinstance(exc, smtplib.SMTPDataError) and not 400 <= exc.smtp_code < 600:
        return _neither_reply(exc.smtp_code, _text(exc.smtp_error))
    if isinstance(exc, smtplib.SMTPResponseException):
        command = "DATA" if isinstance(exc, smtplib.SMTPDataError) else "MAIL FROM"
        return _from_reply(exc.smtp_code, _text(exc.smtp_error), command)
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return TransientError(f"could not connect to the SMTP server: {exc}", reached=False)
    if before_data and isinstance(exc, smtplib.SMTPServerDisconnected | TimeoutError):
        return TransientError(f"SMTP connection lost before the message was sent: {exc}")
    if isinstance(exc, smtplib.SMTPServerDisconnected | TimeoutError):
        # The phase is unknown: the message may have been accepted.
        return OutcomeUnknownError(f"SMTP connection lost: {exc}")
    return exc


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
