"""Send through an SMTP server with aiosmtplib, reusing connections within a batch.

Replies are classified by their code: 4xx is transient (greylisting, a full
queue), 5xx permanent (no such user, policy). A connection refused or lost
before the message was handed over is transient and certainly not delivered;
a connection lost or timed out *during* DATA leaves the outcome unknown
(``OutcomeUnknownError``), and since plain SMTP has no idempotency keys the
engine does not retry it: the caller records it as unknown.

Each send runs one transaction on a pooled connection (at most
``max_connections``, which is also the channel's ``max_concurrency``). A
pooled connection the server has dropped is replaced once, transparently,
before anything was sent on it. A connection whose send was cancelled or
failed mid-transaction is closed, never reused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import smtplib
import socket
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import aiosmtplib

from clock import Clock
from delivery.envelope import Envelope
from delivery.errors import OutcomeUnknownError, PermanentError, TransientError
from delivery.message import Sender, message_id_for, parse_sender, write_message

__all__ = ["SmtpSettings", "SmtpChannel", "translate_smtplib_error"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpSettings:
    """Where and how to connect; plain values, e.g. copied from Django's EMAIL_* settings.

    ``use_tls`` is implicit TLS (port 465, Django's EMAIL_USE_SSL).
    ``starttls`` upgrades a plain connection: ``None`` (the default) whenever
    the server offers it, ``True`` always (Django's EMAIL_USE_TLS, port 587:
    a server without it is an error), ``False`` never.

    A login is only made over an encrypted connection: a server that offers
    no TLS gets no password unless ``allow_plaintext_auth`` is set (a relay
    on a trusted network; EMAIL_ALLOW_PLAINTEXT_AUTH).
    """

    host: str
    from_email: str
    port: int = 25
    username: str = ""
    password: str = field(default="", repr=False)
    use_tls: bool = False
    starttls: bool | None = None
    allow_plaintext_auth: bool = False
    timeout: float = 10.0
    max_connections: int = 1
    message_id_domain: str = ""
    local_hostname: str | None = None
    validate_certs: bool = True

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("SmtpSettings.host is empty; pass the SMTP server (EMAIL_HOST).")
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not 0 < self.port < 65536
        ):
            raise ValueError(f"SmtpSettings.port must be 1-65535 (got {self.port!r}).")
        if self.use_tls and self.starttls:
            raise ValueError(
                "SmtpSettings.use_tls and starttls are mutually exclusive; use_tls for port 465, "
                "starttls for port 587."
            )
        if bool(self.username) != bool(self.password):
            raise ValueError(
                "SmtpSettings needs both username and password, or neither (no authentication)."
            )
        if (
            not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or (self.timeout <= 0)
        ):
            raise ValueError(f"SmtpSettings.timeout must be seconds > 0 (got {self.timeout!r}).")
        if not isinstance(self.max_connections, int) or self.max_connections < 1:
            raise ValueError(
                f"SmtpSettings.max_connections must be >= 1 (got {self.max_connections!r})."
            )
        parse_sender(self.from_email, setting="SmtpSettings.from_email")


def _from_reply(code: int, text: str, what: str) -> TransientError | PermanentError:
    message = f"SMTP {code} on {what}: {text.strip()}"
    if 400 <= code < 500:
        return TransientError(message)
    return PermanentError(message)


class SmtpChannel:
    """Deliver envelopes as email through one SMTP server."""

    honours_idempotency_keys = False

    def __init__(self, settings: SmtpSettings, *, clock: Clock, name: str = "smtp") -> None:
        self.name = name
        self.settings = settings
        self.max_concurrency = settings.max_connections
        self._clock = clock
        self._sender: Sender = parse_sender(settings.from_email, setting="SmtpSettings.from_email")
        self._domain = settings.message_id_domain or self._sender.domain
        self._idle: list[aiosmtplib.SMTP] = []
        self._slots: asyncio.Semaphore | None = None
        #: Connections opened during the batch (observability, tests).
        self.connections_opened = 0

    async def __aenter__(self) -> Self:
        self._slots = asyncio.Semaphore(self.settings.max_connections)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        idle, self._idle = self._idle, []
        for connection in idle:
            try:
                await connection.quit()
            except (aiosmtplib.SMTPException, OSError):
                connection.close()
        return None

    async def _connect(self) -> aiosmtplib.SMTP:
        settings = self.settings
        # The login is ours, after the TLS decision, not aiosmtplib's on connect.
        connection = aiosmtplib.SMTP(
            hostname=settings.host,
            port=settings.port,
            use_tls=settings.use_tls,
            start_tls=settings.starttls,
            timeout=settings.timeout,
            local_hostname=settings.local_hostname,
            validate_certs=settings.validate_certs,
        )
        try:
            await connection.connect()
            if settings.username:
                self._refuse_plaintext_login(connection)
                await connection.login(settings.username, settings.password)
        except asyncio.CancelledError:
            connection.close()
            raise
        except aiosmtplib.SMTPAuthenticationError as exc:
            connection.close()
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
        self.connections_opened += 1
        return connection

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
        if self._slots is None:
            raise RuntimeError("SmtpChannel.send() needs the channel open: use 'async with'.")
        message = write_message(
            envelope, sender=self._sender, message_id_domain=self._domain, date=self._clock.now()
        )
        data, recipient = message.data, message.recipient
        async with self._slots:
            reused = bool(self._idle)
            connection = self._idle.pop() if reused else await self._connect()
            reusable = False
            try:
                try:
                    await self._envelope_commands(connection, recipient)
                except aiosmtplib.SMTPServerDisconnected:
                    if not reused:
                        raise
                    # The server dropped an idle pooled connection: replace it once.
                    logger.info(
                        "SMTP connection to %s was dropped; reconnecting", self.settings.host
                    )
                    connection.close()
                    connection = await self._connect()
                    await self._envelope_commands(connection, recipient)
                await self._data(connection, data)
                reusable = True
            except (aiosmtplib.SMTPException, OSError) as exc:
                # Everything here happened before DATA (``_data`` translates its own
                # errors), so the server cannot have accepted the message.
                if isinstance(exc, aiosmtplib.SMTPResponseException):  # MAIL/RCPT refused
                    reusable = await self._reset(connection)
                    command = (
                        "RCPT TO"
                        if isinstance(exc, aiosmtplib.SMTPRecipientRefused)
                        else "MAIL FROM"
                    )
                    raise _from_reply(exc.code, exc.message, command) from exc
                raise TransientError(
                    f"SMTP connection to {self.settings.host} failed before the message was "
                    f"sent: {exc}"
                ) from exc
            finally:
                if reusable:
                    self._idle.append(connection)
                else:
                    connection.close()
        return message_id_for(envelope.key, self._domain)

    async def _envelope_commands(self, connection: aiosmtplib.SMTP, recipient: str) -> None:
        await connection.mail(self._sender.address)
        await connection.rcpt(recipient)

    async def _data(self, connection: aiosmtplib.SMTP, data: bytes) -> None:
        try:
            await connection.data(data)
        except aiosmtplib.SMTPResponseException as exc:
            # A definite refusal of the message; the transaction is over.
            raise _from_reply(exc.code, exc.message, "DATA") from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise OutcomeUnknownError(
                f"SMTP connection to {self.settings.host} failed during DATA; the server may "
                f"have accepted the message: {exc}"
            ) from exc

    async def _reset(self, connection: aiosmtplib.SMTP) -> bool:
        """End a refused transaction so the connection can be reused; False if it cannot."""
        try:
            await connection.rset()
        except (aiosmtplib.SMTPException, OSError):
            return False
        return True


def translate_smtplib_error(exc: BaseException) -> BaseException:
    """Map a stdlib ``smtplib``/socket error to a delivery error; return others unchanged.

    For blocking senders run by ``ThreadedChannel`` (e.g. Django's SMTP
    backend), which raise ``smtplib`` exceptions: ``except Exception as exc:
    raise translate_smtplib_error(exc) from exc``. Without it every
    ``smtplib`` error is an ``OSError`` to the engine, so a refused recipient
    would look like a lost connection.
    """
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return PermanentError(
            f"SMTP login refused ({exc.smtp_code}): {_text(exc.smtp_error)}; "
            "check the username and password",
            reached=False,
        )
    if isinstance(exc, smtplib.SMTPConnectError):
        return TransientError(
            f"SMTP server refused the session ({exc.smtp_code}): {_text(exc.smtp_error)}",
            reached=False,
        )
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        for code, text in exc.recipients.values():
            return _from_reply(code, _text(text), "RCPT TO")
    if isinstance(exc, smtplib.SMTPResponseException):
        command = "DATA" if isinstance(exc, smtplib.SMTPDataError) else "MAIL FROM"
        return _from_reply(exc.smtp_code, _text(exc.smtp_error), command)
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return TransientError(f"could not connect to the SMTP server: {exc}", reached=False)
    if isinstance(exc, smtplib.SMTPServerDisconnected | TimeoutError):
        # The phase is unknown: the message may already have been accepted.
        return OutcomeUnknownError(f"SMTP connection lost: {exc}")
    return exc


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
