"""HttpChannel against a real loopback HTTP provider (loopback.http_sink)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

import pytest

from delivery import Attachment, DeliveryLimits, Outcome, deliver
from delivery.channels import HttpChannel, HttpSettings
from delivery.channels.http import parse_retry_after
from delivery.limiter import LocalRateLimiter
from loopback._loop_thread import LoopThread
from loopback.http_sink import HttpSink
from tests.delivery.conftest import START, run

pytestmark = pytest.mark.timeout(30)

QUICK = DeliveryLimits(concurrency=10, call_timeout=5, max_attempts=3, backoff_base=0.01)


def channel_for(sink: HttpSink, clock, **settings) -> HttpChannel:
    values = {"url": sink.url, "secret": "test-secret"}
    values.update(settings)
    return HttpChannel(HttpSettings(**values), clock=clock)


def test_a_reminder_is_posted_as_signed_json_with_its_idempotency_key(
    http_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope(
        subject="Erinnerung: Töpferkurs\nbeginnt",
        html_body="<p>Bis gleich</p>",
        attachments=[Attachment(filename="kurs.ics", content_type="text/calendar", content=b"IC")],
        payload={"workshop_title": "Töpferkurs", "starts_at": "2026-03-02T10:00:00+01:00"},
    )

    [result] = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.message_id, result.attempts) == (Outcome.SENT, "sink-1", 1)
    [request] = http_sink.requests
    assert request.status == 200  # the sink verified the signature
    assert request.headers["idempotency-key"] == envelope.key
    assert request.headers["x-reminders-signature"].startswith("sha256=")
    assert request.json() == {
        "version": 2,
        "key": envelope.key,
        "reminder_id": envelope.reminder_id,
        "recipient": {"email": envelope.recipient, "name": envelope.recipient_name},
        "subject": "Erinnerung: Töpferkurs beginnt",
        "text_body": "See you there.",
        "html_body": "<p>Bis gleich</p>",
        "attachments": [
            {"filename": "kurs.ics", "content_type": "text/calendar", "content_base64": "SUM="}
        ],
        "deadline_at": envelope.deadline_at.isoformat().replace("+00:00", "Z"),
        "payload": {"workshop_title": "Töpferkurs", "starts_at": "2026-03-02T10:00:00+01:00"},
    }


def test_a_wrong_secret_is_rejected_by_the_provider_and_fails_permanently(
    http_sink, system_clock, make_real_envelope
):
    channel = channel_for(http_sink, system_clock, secret="not-the-secret")

    [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

    assert result.outcome is Outcome.PERMANENT
    assert result.error == (
        f"HTTP 401 from {http_sink.url}: missing or invalid X-Reminders-Signature"
    )
    assert http_sink.stats()["bad_signatures"] == 1


def test_a_resend_of_the_same_key_is_deduplicated_by_the_provider(
    http_sink, system_clock, make_real_envelope
):
    """Two batches send one key: same message id, one duplicate counted, one message."""
    envelope = make_real_envelope()

    first = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )
    second = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert first[0].message_id == second[0].message_id == "sink-1"
    stats = http_sink.stats()
    assert (stats["accepted"], stats["duplicates"]) == (1, 1)


def test_server_errors_are_retried_until_the_provider_accepts(
    http_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope()
    http_sink.script(envelope.key, 503, 502)

    [result] = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.attempts) == (Outcome.SENT, 3)
    assert [r.status for r in http_sink.requests] == [503, 502, 200]


def test_a_429_with_retry_after_delays_the_retry_by_that_long(
    http_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope()
    http_sink.configure(retry_after=0.3)
    http_sink.script(envelope.key, 429)

    [result] = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.attempts) == (Outcome.SENT, 2)
    first, second = http_sink.arrivals()
    assert second - first >= 0.3


def test_a_permanent_4xx_is_not_retried_and_keeps_the_providers_reason(
    http_sink, system_clock, make_real_envelope
):
    envelope = make_real_envelope()
    http_sink.script(envelope.key, 422)

    [result] = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.attempts) == (Outcome.PERMANENT, 1)
    assert result.error == f"HTTP 422 from {http_sink.url}: scripted 422"


def test_a_slow_provider_call_times_out_while_the_rest_of_the_batch_is_sent(
    http_sink, system_clock, make_real_envelope
):
    """The batch takes about the 1 s call timeout, not the provider's 5 s. The timeout leaves
    the four fast calls room on a loaded host (the chaos run beside the suite)."""
    envelopes = [make_real_envelope() for _ in range(5)]
    http_sink.slow(envelopes[2].key, 5.0)
    policy = DeliveryLimits(concurrency=5, call_timeout=1.0, max_attempts=1)
    began = system_clock.monotonic()

    results = run(
        deliver(envelopes, channel_for(http_sink, system_clock), policy=policy, clock=system_clock)
    )
    elapsed = system_clock.monotonic() - began

    assert [r.outcome for r in results] == [Outcome.SENT] * 2 + [Outcome.TIMED_OUT] + [
        Outcome.SENT
    ] * 2
    assert results[2].maybe_delivered is True
    # Cut at the 1 s call timeout, not after the sink's 5 s delay.
    assert 1.0 <= elapsed < 5.0


def test_a_lost_answer_is_retried_with_the_same_key_and_the_provider_sends_once(
    http_sink, system_clock, make_real_envelope
):
    """The provider accepted the first request but answered too late; the retry is a duplicate.

    The retry's 1 s leaves a loaded host room for a new connection's round trip."""
    envelope = make_real_envelope()
    http_sink.slow(envelope.key, 4.0)
    policy = DeliveryLimits(call_timeout=1.0, max_attempts=3, backoff_base=0.01)

    [result] = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=policy, clock=system_clock)
    )

    assert (result.outcome, result.attempts, result.message_id) == (Outcome.SENT, 2, "sink-1")
    stats = http_sink.stats()
    assert (stats["accepted"], stats["duplicates"]) == (1, 1)


def test_a_provider_that_refuses_connections_was_never_reached(
    system_clock, make_real_envelope, refusing_port
):
    port = refusing_port()
    channel = HttpChannel(
        HttpSettings(url=f"http://127.0.0.1:{port}/reminders", secret="s"), clock=system_clock
    )

    [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

    assert result.outcome is Outcome.TRANSIENT
    assert (result.attempts, result.provider_reached, result.maybe_delivered) == (3, False, False)
    assert "could not connect to" in result.error


def test_hedged_endpoints_that_all_fail_are_named_by_their_redacted_urls(
    system_clock, make_real_envelope, refusing_port
):
    """Issue 34, item 6: the error names each endpoint without its user info or tokens."""
    ports = [refusing_port(), refusing_port()]
    first, second = (f"http://ops:Pw-9876@127.0.0.1:{port}/r?token=Tk-1234" for port in ports)
    channel = HttpChannel(
        HttpSettings(url=first, hedge_urls=(second,), secret="s"), clock=system_clock
    )

    [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

    assert result.outcome is Outcome.TRANSIENT
    assert "hedged endpoints failed" in result.error
    assert f"127.0.0.1:{ports[1]}/r?token=***" in result.error
    assert "Tk-1234" not in result.error and "Pw-9876" not in result.error


def test_hedged_urls_return_the_fastest_provider_and_drop_the_slow_one(
    system_clock, make_real_envelope
):
    with (
        HttpSink(secret="test-secret", delay=3.0, id_prefix="slow") as slow,
        HttpSink(secret="test-secret", id_prefix="fast") as fast,
    ):
        channel = HttpChannel(
            HttpSettings(url=slow.url, hedge_urls=(fast.url,), secret="test-secret"),
            clock=system_clock,
        )
        [result] = run(deliver([make_real_envelope()], channel, policy=QUICK, clock=system_clock))

        # The fast endpoint's id, told apart by its prefix rather than by a time bound.
        assert result.outcome is Outcome.SENT
        assert result.message_id == "fast-1"
        assert fast.stats()["accepted"] == 1
        assert slow.stats()["accepted"] <= 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"url": "", "secret": "s"}, "HttpSettings.url '' is not an http(s) URL"),
        ({"url": "ftp://x/y", "secret": "s"}, "HttpSettings.url 'ftp://x/y' is not an http(s) URL"),
        ({"url": "https://x/y", "secret": ""}, "HttpSettings.secret is empty"),
        ({"url": "https://x/y", "secret": "s", "hedge_urls": ["https://x/y"]}, "repeats a URL"),
        ({"url": "https://x/y", "secret": "s", "timeout": 0}, "timeout must be seconds > 0"),
        (
            {"url": "https://x/y", "secret": "s", "hedge_stagger": -1},
            "hedge_stagger must be seconds >= 0",
        ),
        (
            {"url": "http://notify.example.com/r?token=t0ps3cret", "secret": "s"},
            "HttpSettings.url 'http://notify.example.com/r?token=***' is plain http to another "
            "machine",
        ),
        (
            {"url": "https://a/r", "hedge_urls": ["http://10.0.0.7/r"], "secret": "s"},
            "HttpSettings.hedge_urls 'http://10.0.0.7/r' is plain http to another machine",
        ),
    ],
)
def test_missing_or_bad_settings_fail_at_construction(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        HttpSettings(**settings)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/r",
        "http://127.8.9.10/r",
        "http://[::1]:9000/r",
        "http://localhost/r",
        "http://api.localhost/r",
    ],
)
def test_plain_http_is_accepted_to_this_machine(url):
    assert HttpSettings(url=url, secret="s").url == url


def test_plain_http_to_another_machine_needs_the_operators_consent():
    url = "http://notify.internal/r"
    assert HttpSettings(url=url, secret="s", allow_insecure_http=True).url == url
    with pytest.raises(ValueError, match="REMINDERS_HTTP_ALLOW_INSECURE=1"):
        HttpSettings(url=url, secret="s")


def test_retry_after_is_read_as_seconds_or_as_an_http_date():
    assert parse_retry_after("120", now=START) == 120.0
    assert parse_retry_after("Mon, 02 Mar 2026 09:00:30 GMT", now=START) == 30.0
    assert parse_retry_after("soon", now=START) is None
    assert parse_retry_after("0", now=START) == 0.0
    # A date already past (the provider's clock is behind): no hint, as if none were given.
    assert parse_retry_after("Mon, 02 Mar 2026 08:59:30 GMT", now=START) is None
    assert parse_retry_after(None, now=START) is None
    # A date in no known zone, or a number no wait can be: ignored, the backoff decides.
    assert parse_retry_after("Mon, 02 Mar 2026 09:00:30 -0000", now=START) is None
    assert parse_retry_after("inf", now=START) is None
    assert parse_retry_after("nan", now=START) is None


class _OneAnswer:
    """A raw HTTP server on loopback giving every request the same answer."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self._thread = LoopThread("one-answer-http")

    async def _serve(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)))
        writer.write(self.answer)
        await writer.drain()
        writer.close()

    def __enter__(self) -> str:
        self._thread.start()

        async def listen():
            return await asyncio.start_server(self._serve, "127.0.0.1", 0)

        self._server = self._thread.run(listen)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/r"

    def __exit__(self, *exc_info) -> None:
        async def close():
            self._server.close()

        self._thread.run(close)
        self._thread.stop()


def _answer(status: str, body: bytes, content_type: str) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def test_an_error_page_that_is_not_json_is_quoted_on_one_line(system_clock, make_real_envelope):
    """A proxy in front of the provider answers 502 with HTML: its text is the error."""
    page = b"<html>\n  <h1>502 Bad Gateway</h1>\n</html>\n"
    with _OneAnswer(_answer("502 Bad Gateway", page, "text/html")) as url:
        channel = HttpChannel(HttpSettings(url=url, secret="s"), clock=system_clock)
        policy = DeliveryLimits(call_timeout=5, max_attempts=1)
        [result] = run(deliver([make_real_envelope()], channel, policy=policy, clock=system_clock))
    assert result.outcome is Outcome.TRANSIENT
    assert result.error.endswith(f"HTTP 502 from {url}: <html> <h1>502 Bad Gateway</h1> </html>")


@pytest.mark.parametrize(
    "body",
    [b"OK", b'{"status": "queued"}', b'["sink-1"]'],
    ids=["not-json", "no-message-id", "a-json-list"],
)
def test_an_acceptance_without_a_message_id_is_still_sent_and_logged(
    system_clock, make_real_envelope, caplog, body
):
    """Accepted is accepted: failing it would send the message again."""
    envelope = make_real_envelope()
    with _OneAnswer(_answer("202 Accepted", body, "application/json")) as url:
        channel = HttpChannel(HttpSettings(url=url, secret="s"), clock=system_clock)
        with caplog.at_level(logging.WARNING):
            [result] = run(deliver([envelope], channel, policy=QUICK, clock=system_clock))
    assert (result.outcome, result.attempts, result.message_id) == (Outcome.SENT, 1, None)
    assert f"accepted reminder {envelope.reminder_id} without a message_id" in caplog.text


def test_a_refusal_names_the_endpoint_without_a_password_that_holds_a_quote(
    http_sink, system_clock, make_real_envelope
):
    """A quote is allowed in a URL's user info and query; the error still masks them whole."""
    envelope = make_real_envelope()
    http_sink.script(envelope.key, 422)
    url = http_sink.url.replace("://", "://ops:Pw'9876@", 1) + "?token=Tk'1234"
    channel = HttpChannel(HttpSettings(url=url, secret="test-secret"), clock=system_clock)

    [result] = run(deliver([envelope], channel, policy=QUICK, clock=system_clock))

    assert result.outcome is Outcome.PERMANENT
    assert "9876" not in result.error and "1234" not in result.error, result.error
    assert result.error.endswith(": scripted 422")


class _EndlessAnswer(_OneAnswer):
    """A raw HTTP server on loopback answering with ``status`` and a body that never ends."""

    def __init__(self, status: str) -> None:
        super().__init__(
            f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )

    async def _serve(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)))
        writer.write(self.answer)
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()


def test_an_answer_whose_body_never_ends_is_read_only_as_far_as_its_reason(
    system_clock, make_real_envelope
):
    """A refusal is a refusal however long its page: the channel reads the start of it (the
    reason shown to staff), not the body to its end, which could fill the worker's memory."""
    with _EndlessAnswer("422 Unprocessable Entity") as url:
        channel = HttpChannel(HttpSettings(url=url, secret="s", timeout=2), clock=system_clock)
        policy = DeliveryLimits(call_timeout=3, max_attempts=1)
        [result] = run(deliver([make_real_envelope()], channel, policy=policy, clock=system_clock))
    assert (result.outcome, result.maybe_delivered) == (Outcome.PERMANENT, False), result.error
    assert result.error.startswith(f"HTTP 422 from {url}: xxx")


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_past_any_deadline_ends_the_reminder_as_not_retried(
    http_sink, system_clock, make_real_envelope, status
):
    """Retry-After: 1e+12 (32,000 years): the next try would come after the deadline."""
    envelope = make_real_envelope()
    http_sink.configure(retry_after=1e12)
    http_sink.script(envelope.key, status)

    [result] = run(
        deliver([envelope], channel_for(http_sink, system_clock), policy=QUICK, clock=system_clock)
    )

    assert (result.outcome, result.attempts) == (Outcome.TRANSIENT, 1), result.error
    assert "would start at or after the deadline" in result.error


@pytest.mark.parametrize("value", ["Thu, 01 Jan 2015 00:00:00 GMT", "-30", "-1e+12"])
def test_a_429_with_a_past_date_or_a_negative_retry_after_pauses_every_sender_as_one_without_it(
    system_clock, make_real_envelope, value
):
    """A date already past says the provider's clock is behind, and Retry-After is digits (RFC
    9110 10.2.3): neither is a hint, nor "go on at full rate": the shared limiter pauses its
    window, as for a 429 with no Retry-After."""
    assert parse_retry_after(value, now=START) is None
    answer = (
        f"HTTP/1.1 429 Too Many Requests\r\nRetry-After: {value}\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n"
    ).encode()
    limiter = LocalRateLimiter(100, clock=system_clock, window=0.5)
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1)
    with _OneAnswer(answer) as url:
        channel = HttpChannel(HttpSettings(url=url, secret="s"), clock=system_clock)
        began = system_clock.monotonic()
        results = run(
            deliver(
                [make_real_envelope(), make_real_envelope()],
                channel,
                policy=policy,
                clock=system_clock,
                limiter=limiter,
            )
        )
        elapsed = system_clock.monotonic() - began
    assert [r.outcome for r in results] == [Outcome.TRANSIENT] * 2
    assert elapsed >= 0.5  # the second call waited out the pause the first one's 429 set


def test_a_compressed_answer_is_read_no_further_than_an_uncompressed_one(
    system_clock, make_real_envelope, monkeypatch
):
    """The contract's 64 KiB bound holds for the bytes the worker keeps, not only those on the
    wire: 60 KB of gzip that inflates to 60 MB (one answer of a hundred calls in flight)
    is not inflated. The channel asks for no compression, and takes a compressed answer as is."""
    import gzip

    from delivery.channels import http

    kept: list[int] = []
    read_answer = http._read_answer

    async def counted(response):
        answer = await read_answer(response)
        kept.append(len(answer))
        return answer

    monkeypatch.setattr(http, "_read_answer", counted)
    page = gzip.compress(b"x" * (60 * 1024 * 1024), 9)
    answer = (
        "HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: text/plain\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(page)}\r\nConnection: close\r\n\r\n"
    ).encode() + page
    with _OneAnswer(answer) as url:
        channel = HttpChannel(HttpSettings(url=url, secret="s"), clock=system_clock)
        policy = DeliveryLimits(call_timeout=5, max_attempts=1)
        [result] = run(deliver([make_real_envelope()], channel, policy=policy, clock=system_clock))
    assert (result.outcome, result.maybe_delivered) == (Outcome.PERMANENT, False), result.error
    assert result.error.startswith(f"HTTP 422 from {url}: ")
    assert kept and max(kept) <= 64 * 1024, kept


def test_the_request_asks_for_an_uncompressed_answer(http_sink, system_clock, make_real_envelope):
    run(
        deliver(
            [make_real_envelope()],
            channel_for(http_sink, system_clock),
            policy=QUICK,
            clock=system_clock,
        )
    )
    [request] = http_sink.requests
    assert request.headers["accept-encoding"] == "identity"
