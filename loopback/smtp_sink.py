"""A real SMTP server on 127.0.0.1 (aiosmtpd) that records what it receives.

- Records each message: arrival time (monotonic), envelope sender and
  recipients, raw bytes, and the header fields, decoded on demand with the
  stdlib email package, so tests can see exactly what a client sent.
- Counts duplicates by ``Message-ID`` and by (recipient, subject).
- Counts connections (to check reuse) and can drop them all at once.
- Misbehaves on request: per-recipient scripted RCPT replies (``451 ...``,
  ``550 ...``), a reply for the next DATA commands, or a delay before DATA
  is answered (a slow server).
- Offers PIPELINING (RFC 2920) unless ``pipelining=False``: aiosmtpd reads
  and answers commands one line at a time, so a group written at once is
  answered in order, and the replies to a group go out together.
- Optional AUTH (PLAIN/LOGIN, allowed without TLS: this is loopback only).
- Optional TLS: STARTTLS (required before MAIL, or only offered with
  ``require_starttls=False``) or implicit TLS, given an ``ssl.SSLContext``
  with a certificate; each message and each login records whether it came
  over TLS.

In-process: ``with SmtpSink() as sink: ... sink.port ...``. As a process::

    python -m loopback.smtp_sink --port 8025 --jsonl var/smtp.jsonl

which prints ``smtp_sink listening on 127.0.0.1:PORT`` and appends one JSON
line per received message to the file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import threading
from collections import Counter, deque
from dataclasses import dataclass
from email import message_from_bytes
from email import policy as email_policy
from email.parser import BytesParser
from pathlib import Path
from typing import Any, Self

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

from clock import Clock, SystemClock
from loopback._loop_thread import LoopThread

__all__ = ["SmtpSink", "ReceivedMessage"]


@dataclass(slots=True, frozen=True)
class ReceivedMessage:
    """One message as the server received it.

    ``raw_headers`` are the header fields as sent (folding and encoded
    words left as they are); ``header`` decodes one on demand with the
    modern email policy. Decoding every field of every message as it arrived cost the
    sink more CPU per message (2-8 ms) than the product spent sending it.
    """

    arrived_at: float
    mail_from: str
    rcpt_tos: tuple[str, ...]
    raw: bytes
    raw_headers: tuple[tuple[str, str], ...]
    tls: bool = False
    #: When the client started the call, monotonic: the connection's EHLO for the first
    #: transaction on it, MAIL FROM for a later one.
    began_at: float | None = None

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Every header field, decoded."""
        return tuple((name, _decoded(name, value)) for name, value in self.raw_headers)

    def header(self, name: str) -> str | None:
        """Return the first header called ``name`` (decoded), or None."""
        found = self.header_all(name)
        return found[0] if found else None

    def header_all(self, name: str) -> list[str]:
        return [
            _decoded(key, value) for key, value in self.raw_headers if key.lower() == name.lower()
        ]

    @property
    def message_id(self) -> str | None:
        return self.header("Message-ID")

    @property
    def subject(self) -> str | None:
        return self.header("Subject")

    def parsed(self):
        """Return the message parsed with the modern email policy."""
        return message_from_bytes(self.raw, policy=email_policy.default)

    def as_json(self) -> dict[str, Any]:
        return {
            "arrived_at": self.arrived_at,
            "mail_from": self.mail_from,
            "rcpt_tos": list(self.rcpt_tos),
            "message_id": self.message_id,
            "subject": self.subject,
            "raw_headers": [[name, _text(value)] for name, value in self.raw_headers],
            "size": len(self.raw),
            "tls": self.tls,
        }


_HEADERS_ONLY = BytesParser(policy=email_policy.compat32)


def _raw_headers(raw: bytes) -> tuple[tuple[str, str], ...]:
    return tuple(_HEADERS_ONLY.parsebytes(raw, headersonly=True).raw_items())


def _text(value: str) -> str:
    """A raw field as text: 8-bit bytes the parser kept as surrogates read as UTF-8."""
    return value.encode("ascii", "surrogateescape").decode("utf-8", "replace")


def _decoded(name: str, value: str) -> str:
    """Decode one raw header field as ``message_from_bytes(..., policy=default)`` would."""
    return str(email_policy.default.header_fetch_parse(name, value))


class _TrackingSMTP(SMTP):
    """aiosmtpd's server protocol, counting and remembering its connections."""

    def __init__(self, sink: SmtpSink, **kwargs: Any) -> None:
        super().__init__(sink, **kwargs)
        self._sink = sink
        self._held: list[bytes] = []

    async def push(self, status: str | bytes) -> None:
        """Write a reply; with PIPELINING, hold it while more commands are already buffered.

        RFC 2920 3.2: the replies to a group of commands go out as one unit, as
        Postfix sends them, not one packet per command. A client that waits for
        each reply has nothing buffered, so it gets each at once.
        """
        if isinstance(status, str):
            status = status.encode("utf-8" if self.enable_SMTPUTF8 else "ascii")
        self._held.append(status + b"\r\n")
        reader = self._reader
        # StreamReader keeps what it read ahead in _buffer; a complete line there is a
        # command the client sent with this one.
        if self._sink.pipelining and reader is not None and b"\n" in reader._buffer:
            return
        held, self._held = b"".join(self._held), []
        self._writer.write(held)
        await self._writer.drain()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        first = self.transport is None
        super().connection_made(transport)
        if first:
            self._sink._connected(self)

    def connection_lost(self, error: Exception | None) -> None:
        self._sink._disconnected(self)
        super().connection_lost(error)


def _over_tls(server: SMTP) -> bool:
    transport = server.transport
    return transport is not None and transport.get_extra_info("ssl_object") is not None


class SmtpSink:
    """A loopback SMTP server for channel tests, benchmarks and chaos runs."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        jsonl: str | Path | None = None,
        credentials: tuple[str, str] | None = None,
        tls_context: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
        require_starttls: bool = True,
        pipelining: bool = True,
    ) -> None:
        self.host = host
        self.pipelining = pipelining
        self.port = port
        self._clock = clock or SystemClock()
        self._jsonl = Path(jsonl) if jsonl else None
        self._credentials = credentials
        self._tls_context = tls_context
        self._implicit_tls = implicit_tls
        self._require_starttls = require_starttls
        if implicit_tls and tls_context is None:
            raise ValueError("SmtpSink(implicit_tls=True) needs tls_context.")
        self._lock = threading.Lock()
        self._thread = LoopThread("loopback.smtp_sink")
        self._server: asyncio.AbstractServer | None = None
        self._protocols: set[_TrackingSMTP] = set()
        self._rcpt_scripts: dict[str, deque[str]] = {}
        self._data_replies: deque[str] = deque()
        self.data_delay = 0.0
        #: Seconds to wait *after* recording a message before answering 250: a
        #: client that dies meanwhile had its message accepted but never heard.
        self.reply_delay = 0.0
        self._reset_state()

    def _reset_state(self) -> None:
        self.messages: list[ReceivedMessage] = []
        self.connections_opened = 0
        self.logins: list[str] = []
        #: Every AUTH received, right or wrong: (login, whether it came over TLS).
        self.auth_attempts: list[tuple[str, bool]] = []
        #: Every MAIL FROM received, accepted or not: (sender, whether it came over TLS).
        self.mail_commands: list[tuple[str, bool]] = []
        self._peak_connections = 0

    # -- lifecycle -----------------------------------------------------------

    def _factory(self) -> _TrackingSMTP:
        options: dict[str, Any] = {
            "hostname": "loopback-smtp",
            "ident": "loopback smtp_sink",
            "loop": asyncio.get_running_loop(),
        }
        if self._credentials is not None:
            options.update(auth_require_tls=False, authenticator=self._authenticate)
        if self._tls_context is not None and not self._implicit_tls:
            options.update(tls_context=self._tls_context, require_starttls=self._require_starttls)
        return _TrackingSMTP(self, **options)

    async def serve(self) -> asyncio.AbstractServer:
        """Start listening on the running loop; return the server."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory,
            self.host,
            self.port,
            ssl=self._tls_context if self._implicit_tls else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self._server

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for protocol in list(self._protocols):
            if protocol.transport is not None:
                protocol.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def start(self) -> Self:
        self._thread.start()
        try:
            self._thread.run(self.serve)
        except BaseException:
            self._thread.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread.running:
            try:
                self._thread.run(self.close)
            finally:
                self._thread.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- control -------------------------------------------------------------

    def script_rcpt(self, recipient: str, *replies: str) -> None:
        """Answer the next RCPT TO for ``recipient`` with ``replies``, in order."""
        with self._lock:
            self._rcpt_scripts.setdefault(recipient.lower(), deque()).extend(replies)

    def reply_to_data(self, *replies: str) -> None:
        """Answer the next DATA commands with ``replies`` instead of accepting."""
        with self._lock:
            self._data_replies.extend(replies)

    def drop_connections(self) -> int:
        """Close every client connection (as a server restart would); return how many."""

        def drop() -> int:
            protocols = [p for p in self._protocols if p.transport is not None]
            for protocol in protocols:
                protocol.transport.close()
            return len(protocols)

        if self._thread.running:
            return self._thread.call(drop)
        return drop()

    def reset(self) -> None:
        with self._lock:
            self._reset_state()

    # -- reading -------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._protocols)

    def received(self) -> list[ReceivedMessage]:
        with self._lock:
            return list(self.messages)

    def duplicates_by_message_id(self) -> int:
        """Return how many received messages repeat an earlier Message-ID."""
        counts = Counter(m.message_id for m in self.received() if m.message_id)
        return sum(count - 1 for count in counts.values())

    def duplicates_by_recipient_subject(self) -> int:
        """Return how many deliveries repeat an earlier (recipient, subject) pair."""
        counts = Counter(
            (recipient.lower(), message.subject)
            for message in self.received()
            for recipient in message.rcpt_tos
        )
        return sum(count - 1 for count in counts.values())

    def stats(self) -> dict[str, Any]:
        with self._lock:
            peak = self._peak_connections
            opened = self.connections_opened
        messages = self.received()
        return {
            "messages": len(messages),
            "duplicates_by_message_id": self.duplicates_by_message_id(),
            "duplicates_by_recipient_subject": self.duplicates_by_recipient_subject(),
            "connections_opened": opened,
            "peak_connections": peak,
        }

    # -- protocol hooks ------------------------------------------------------

    def _connected(self, protocol: _TrackingSMTP) -> None:
        with self._lock:
            self._protocols.add(protocol)
            self.connections_opened += 1
            self._peak_connections = max(self._peak_connections, len(self._protocols))

    def _disconnected(self, protocol: _TrackingSMTP) -> None:
        with self._lock:
            self._protocols.discard(protocol)

    def _authenticate(self, server, session, envelope, mechanism, auth_data) -> AuthResult:
        assert self._credentials is not None
        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        username, password = self._credentials
        ok = auth_data.login.decode() == username and auth_data.password.decode() == password
        with self._lock:
            tls = session.ssl is not None or _over_tls(server)
            self.auth_attempts.append((auth_data.login.decode(), tls))
            if ok:
                self.logins.append(username)
        return AuthResult(success=ok, handled=False)

    async def handle_EHLO(self, server, session, envelope, hostname, responses) -> list[str]:
        session.host_name = hostname  # aiosmtpd leaves it to a handler with this hook
        if not hasattr(session, "greeted_at"):  # the first EHLO; STARTTLS sends another
            session.greeted_at = self._clock.monotonic()
        if self.pipelining:
            responses.insert(len(responses) - 1, "250-PIPELINING")
        return responses

    async def handle_MAIL(self, server, session, envelope, address, mail_options) -> str:
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        with self._lock:
            self.mail_commands.append((address, session.ssl is not None or _over_tls(server)))
        # A client's call begins with its connection's EHLO for the first transaction on it
        # and with MAIL FROM for each later one (aiosmtpd's objects take attributes).
        first = getattr(session, "greeted_at", None)
        session.greeted_at = None
        envelope.began_at = first if first is not None else self._clock.monotonic()
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options) -> str:
        with self._lock:
            scripted = self._rcpt_scripts.get(address.lower())
            reply = scripted.popleft() if scripted else None
        if reply is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope) -> str:
        arrived_at = self._clock.monotonic()
        if self.data_delay > 0:
            await self._clock.sleep(self.data_delay)
        with self._lock:
            reply = self._data_replies.popleft() if self._data_replies else None
        if reply is not None:
            return reply
        raw = envelope.original_content or envelope.content
        message = ReceivedMessage(
            arrived_at=arrived_at,
            mail_from=envelope.mail_from,
            rcpt_tos=tuple(envelope.rcpt_tos),
            raw=raw,
            raw_headers=_raw_headers(raw),
            tls=session.ssl is not None or _over_tls(server),
            began_at=getattr(envelope, "began_at", None),
        )
        with self._lock:
            self.messages.append(message)
        if self._jsonl is not None:
            with self._jsonl.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(message.as_json(), ensure_ascii=False) + "\n")
        if self.reply_delay > 0:
            await self._clock.sleep(self.reply_delay)
        return "250 Message accepted for delivery"


def main(argv: list[str] | None = None) -> None:
    """Run the sink as a process until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m loopback.smtp_sink", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--jsonl", default=None, help="append received messages to this file")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before answering DATA")
    args = parser.parse_args(argv)
    sink = SmtpSink(host=args.host, port=args.port, jsonl=args.jsonl)
    sink.data_delay = args.delay

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await sink.serve()
        print(f"smtp_sink listening on {sink.host}:{sink.port}", flush=True)
        await stop.wait()
        await sink.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
