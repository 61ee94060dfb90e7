"""A real HTTP/1.1 provider on 127.0.0.1 that records, deduplicates and misbehaves on request.

It implements the receiving side of ``delivery/HTTP_CONTRACT.md`` on its own
(it does not import ``delivery``), so channel tests check the contract, not
one implementation against itself.

- Records every request: arrival time (monotonic), key, body, answer.
- Deduplicates by ``Idempotency-Key``: a repeat gets the first message id
  and is counted as a duplicate. A request is accepted when it *arrives*,
  before any configured delay, so a client that times out has still been
  served (the "answer lost" case).
- Verifies ``X-Reminders-Signature`` (contract version 2) when given the
  secret: 401 when it is missing, malformed or wrong, never a 500.
- Misbehaves at runtime: ``delay`` (slow answers), ``fail_status`` for the
  next ``fail_next`` requests (or all), ``retry_after`` on 429/503 answers,
  per-key scripted statuses (``CLOSE``: the connection closed without an
  answer), a server-side ``rate_limit`` of N requests per second answered
  with 429 beyond it, and ``drop_connections`` (idle keep-alive connections
  closed by the provider).
- Reports ``max_in_window``: the most requests that arrived in any one second.

In-process: ``with HttpSink() as sink: ... sink.url ...`` (serves from a
background thread). As a process::

    python -m loopback.http_sink --port 8099 --delay 0.1 --secret s3cret

which prints ``http_sink listening on http://127.0.0.1:PORT`` and is
controlled over HTTP: ``POST /_control`` (JSON of settings), ``GET /_stats``,
``GET /_arrivals``, ``POST /_reset``.

The server is asyncio (one thread, keep-alive, hundreds of concurrent
connections); delays do not hold a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import math
import re
import signal
import threading
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any, Self

from clock import Clock, SystemClock
from loopback._loop_thread import LoopThread
from loopback.windows import max_in_window

__all__ = ["CLOSE", "HttpSink", "SinkRequest", "SinkSettings"]

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
# How far a signed timestamp may be from the sink's clock.
SIGNATURE_TOLERANCE = 300
#: A scripted answer (``HttpSink.script``) that closes the connection instead of answering.
CLOSE = 0
_SIGNATURE = re.compile(r"sha256=[0-9a-f]{64}")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass(slots=True)
class SinkSettings:
    """What the sink does with the next requests; change it with ``configure``."""

    delay: float = 0.0
    fail_status: int | None = None
    #: How many requests ``fail_status`` applies to; None: every one until cleared.
    fail_next: int | None = None
    retry_after: float | None = None
    rate_limit: int | None = None
    secret: str | None = None
    #: The accepted message ids are "<id_prefix>-<n>"; give two sinks different ones.
    id_prefix: str = "sink"


@dataclass(slots=True)
class SinkRequest:
    """One request as the sink saw it (control endpoints excluded)."""

    arrived_at: float
    path: str
    key: str | None
    body: bytes
    status: int = 0
    message_id: str | None = None
    duplicate: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    #: When the client started this call: its connection's opening for the first request
    #: on it, the request line for a later one.
    began_at: float | None = None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(slots=True)
class _Parsed:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    arrived_at: float
    began_at: float | None = None


class _BadRequest(Exception):
    pass


class HttpSink:
    """A loopback HTTP provider for tests, benchmarks and chaos runs."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        path: str = "/reminders",
        **settings: Any,
    ) -> None:
        self.host = host
        self.port = port
        self.path = path
        self._clock = clock or SystemClock()
        self._settings = SinkSettings(**settings)
        self._lock = threading.Lock()
        self._thread = LoopThread("loopback.http_sink")
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._scripts: dict[str, deque[int]] = {}
        self._slow: dict[str, deque[float]] = {}
        self._reset_state()

    def _reset_state(self) -> None:
        self.requests: list[SinkRequest] = []
        self._accepted: dict[str, str] = {}
        self._admitted: deque[float] = deque()
        self._statuses: Counter[int] = Counter()
        self._duplicates = 0
        self._bad_signatures = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._connections = 0
        self._peak_connections = 0
        self._connections_opened = 0
        self._ids = 0

    # -- lifecycle -----------------------------------------------------------

    @property
    def url(self) -> str:
        """Return the endpoint URL reminders are POSTed to."""
        return f"http://{self.host}:{self.port}{self.path}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def serve(self) -> asyncio.AbstractServer:
        """Start listening on the running loop; return the server."""
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=MAX_HEADER_BYTES, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self._server

    async def close(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def start(self) -> Self:
        """Serve from a background thread; return self once it listens."""
        self._thread.start()
        try:
            self._thread.run(self.serve)
        except BaseException:
            self._thread.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop serving and join the background thread."""
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

    def configure(self, **changes: Any) -> SinkSettings:
        """Change behaviour for the next requests (e.g. ``delay=0.5``); return the settings."""
        with self._lock:
            for name, value in changes.items():
                if not hasattr(self._settings, name):
                    raise ValueError(f"HttpSink has no setting {name!r}.")
                setattr(self._settings, name, value)
            return SinkSettings(**asdict(self._settings))

    def script(self, key: str, *statuses: int) -> None:
        """Answer the next requests carrying ``key`` with ``statuses``, in order.

        ``CLOSE`` (0) closes the connection without an answer and without
        acting on the request: a provider that closed an idle keep-alive
        connection just as the client sent on it.
        """
        with self._lock:
            self._scripts.setdefault(key, deque()).extend(statuses)

    def slow(self, key: str, *seconds: float) -> None:
        """Delay the answers to the next requests carrying ``key`` by ``seconds``, in order."""
        with self._lock:
            self._slow.setdefault(key, deque()).extend(seconds)

    def drop_connections(self) -> int:
        """Close every client connection now (as a provider closing idle ones); return how many."""

        def drop() -> int:
            writers = list(self._writers)
            for writer in writers:
                writer.close()
            return len(writers)

        if self._thread.running:
            return self._thread.call(drop)
        return drop()

    def reset(self) -> None:
        """Forget recorded requests, keys, scripts and counters (settings stay)."""
        with self._lock:
            self._reset_state()
            self._scripts.clear()
            self._slow.clear()

    @property
    def settings(self) -> SinkSettings:
        with self._lock:
            return SinkSettings(**asdict(self._settings))

    def arrivals(self) -> list[float]:
        """Return the arrival time of every request, in arrival order."""
        with self._lock:
            return [request.arrived_at for request in self.requests]

    def call_starts(self) -> list[float]:
        """Return when the client started each call (see ``SinkRequest.began_at``)."""
        with self._lock:
            return [request.began_at or request.arrived_at for request in self.requests]

    def requests_for(self, key: str) -> list[SinkRequest]:
        with self._lock:
            return [request for request in self.requests if request.key == key]

    def stats(self) -> dict[str, Any]:
        """Return counters: requests, accepted keys, duplicates, statuses, windows."""
        with self._lock:
            arrivals = [request.arrived_at for request in self.requests]
            return {
                "requests": len(self.requests),
                "accepted": len(self._accepted),
                "duplicates": self._duplicates,
                "bad_signatures": self._bad_signatures,
                "statuses": {str(code): count for code, count in sorted(self._statuses.items())},
                "max_in_window": max_in_window(arrivals),
                "peak_in_flight": self._peak_in_flight,
                "peak_connections": self._peak_connections,
                "connections_opened": self._connections_opened,
                "first_arrival": arrivals[0] if arrivals else None,
                "last_arrival": arrivals[-1] if arrivals else None,
            }

    # -- HTTP ----------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        opened_at: float | None = self._clock.monotonic()
        with self._lock:
            self._connections += 1
            self._connections_opened += 1
            self._peak_connections = max(self._peak_connections, self._connections)
        try:
            while True:
                try:
                    parsed = await self._read_request(reader)
                except _BadRequest as exc:
                    writer.write(self._response(400, {"error": str(exc)}, keep_alive=False))
                    await writer.drain()
                    break
                if parsed is None:
                    break
                parsed.began_at, opened_at = opened_at or parsed.arrived_at, None
                status, document, extra = await self._dispatch(parsed)
                if status == CLOSE:
                    break
                writer.write(self._response(status, document, parsed.keep_alive, extra))
                await writer.drain()
                if not parsed.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with self._lock:
                self._connections -= 1
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> _Parsed | None:
        line = await reader.readline()
        if not line:
            return None
        arrived_at = self._clock.monotonic()
        try:
            method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ")
        except ValueError:
            raise _BadRequest(f"malformed request line {line[:80]!r}") from None
        headers: dict[str, str] = {}
        while True:
            header = await reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked(reader)
        else:
            length = int(headers.get("content-length", "0") or 0)
            if length > MAX_BODY_BYTES:
                raise _BadRequest("body too large")
            body = await reader.readexactly(length) if length else b""
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        return _Parsed(method, target, headers, body, keep_alive, arrived_at)

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        chunks = []
        total = 0
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise _BadRequest("body too large")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)

    def _response(
        self,
        status: int,
        document: Any,
        keep_alive: bool,
        extra: dict[str, str] | None = None,
    ) -> bytes:
        body = json.dumps(document).encode()
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: keep-alive" if keep_alive else "Connection: close",
        ]
        lines += [f"{name}: {value}" for name, value in (extra or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def _dispatch(self, parsed: _Parsed) -> tuple[int, Any, dict[str, str]]:
        path = parsed.path.split("?", 1)[0]
        if path.startswith("/_"):
            return self._control(parsed.method, path, parsed.body)
        if parsed.method != "POST":
            return 405, {"error": "POST reminders here"}, {}
        with self._lock:
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        try:
            status, document, extra, delay = self._decide(parsed, path)
            if delay > 0:
                await self._clock.sleep(delay)
            return status, document, extra
        finally:
            with self._lock:
                self._in_flight -= 1

    def _decide(self, parsed: _Parsed, path: str) -> tuple[int, Any, dict[str, str], float]:
        """Decide the answer at arrival time, under the lock; return it with the delay."""
        key = parsed.headers.get("idempotency-key")
        with self._lock:
            settings = self._settings
            record = SinkRequest(
                parsed.arrived_at,
                path,
                key,
                parsed.body,
                headers=parsed.headers,
                began_at=parsed.began_at,
            )
            self.requests.append(record)
            status, document, extra = self._judge(parsed, key, settings, record)
            record.status = status
            self._statuses[status] += 1
            slow = self._slow.get(key or "")
            delay = slow.popleft() if slow else settings.delay
            return status, document, extra, delay

    def _judge(
        self, parsed: _Parsed, key: str | None, settings: SinkSettings, record: SinkRequest
    ) -> tuple[int, Any, dict[str, str]]:
        if settings.secret is not None and not self._signature_ok(parsed, settings.secret):
            self._bad_signatures += 1
            return 401, {"error": "missing or invalid X-Reminders-Signature"}, {}
        if not key:
            return 400, {"error": "Idempotency-Key header is required"}, {}
        try:
            json.loads(parsed.body)
        except ValueError:
            return 400, {"error": "body is not JSON"}, {}
        if settings.rate_limit is not None:
            window_start = parsed.arrived_at - 1.0
            while self._admitted and self._admitted[0] <= window_start:
                self._admitted.popleft()
            if len(self._admitted) >= settings.rate_limit:
                wait = self._admitted[0] + 1.0 - parsed.arrived_at
                return 429, {"error": "rate limit exceeded"}, self._retry_after(max(wait, 0.001))
            self._admitted.append(parsed.arrived_at)
        scripted = self._scripts.get(key)
        if scripted:
            status = scripted.popleft()
            if status == CLOSE:
                return CLOSE, None, {}
            return status, {"error": f"scripted {status}"}, self._configured_retry(settings)
        if settings.fail_status is not None and (
            settings.fail_next is None or settings.fail_next > 0
        ):
            if settings.fail_next is not None:
                settings.fail_next -= 1
            status = settings.fail_status
            return status, {"error": f"configured {status}"}, self._configured_retry(settings)
        if key in self._accepted:
            self._duplicates += 1
            record.duplicate = True
            record.message_id = self._accepted[key]
        else:
            self._ids += 1
            record.message_id = self._accepted[key] = f"{settings.id_prefix}-{self._ids}"
        return 200, {"message_id": record.message_id, "duplicate": record.duplicate}, {}

    @staticmethod
    def _retry_after(seconds: float) -> dict[str, str]:
        # Retry-After is whole seconds (RFC 9110); round up so clients never come early.
        return {"Retry-After": str(max(0, math.ceil(seconds)))}

    @staticmethod
    def _configured_retry(settings: SinkSettings) -> dict[str, str]:
        # Sent as configured: a fractional value lets tests stay fast.
        if settings.retry_after is None:
            return {}
        return {"Retry-After": f"{settings.retry_after:g}"}

    def _signature_ok(self, parsed: _Parsed, secret: str) -> bool:
        """Check the contract's version 2 signature; anything malformed is simply not valid."""
        timestamp = parsed.headers.get("x-reminders-timestamp", "")
        signature = parsed.headers.get("x-reminders-signature", "")
        key = parsed.headers.get("idempotency-key", "")
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
            return False
        if not _SIGNATURE.fullmatch(signature) or not key.isascii():
            return False
        if abs(int(timestamp) - self._clock.now().timestamp()) > SIGNATURE_TOLERANCE:
            return False
        message = b"\n".join((timestamp.encode(), key.encode(), parsed.body))
        expected = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
        return hmac.compare_digest(f"sha256={expected}".encode(), signature.encode())

    def _control(self, method: str, path: str, body: bytes) -> tuple[int, Any, dict[str, str]]:
        if path == "/_stats" and method == "GET":
            return 200, self.stats(), {}
        if path == "/_arrivals" and method == "GET":
            return 200, {"arrivals": self.arrivals()}, {}
        if path == "/_reset" and method == "POST":
            self.reset()
            return 200, {"ok": True}, {}
        if path == "/_control" and method == "POST":
            try:
                changes = json.loads(body or b"{}")
                settings = self.configure(**changes)
            except (ValueError, TypeError) as exc:
                return 400, {"error": str(exc)}, {}
            return 200, asdict(settings), {}
        return 404, {"error": f"no control endpoint {method} {path}"}, {}


def main(argv: list[str] | None = None) -> None:
    """Run the sink as a process until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m loopback.http_sink", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--secret", default=None)
    parser.add_argument("--rate-limit", type=int, default=None)
    parser.add_argument("--fail-status", type=int, default=None)
    parser.add_argument("--fail-next", type=int, default=None)
    parser.add_argument("--retry-after", type=float, default=None)
    args = parser.parse_args(argv)
    sink = HttpSink(
        host=args.host,
        port=args.port,
        delay=args.delay,
        secret=args.secret,
        rate_limit=args.rate_limit,
        fail_status=args.fail_status,
        fail_next=args.fail_next,
        retry_after=args.retry_after,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await sink.serve()
        print(f"http_sink listening on {sink.base_url}", flush=True)
        await stop.wait()
        await sink.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
