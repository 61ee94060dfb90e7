"""The loopback HTTP provider: dedupe, signatures, faults, rate limits, concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket

import httpx
import pytest

from clock import SystemClock
from loopback.http_sink import HttpSink
from loopback.windows import max_in_window
from tests.loopback.conftest import start_server_process, stop_server_process
from tests.support.races import wait_until

pytestmark = pytest.mark.timeout(30)

BODY = b'{"key":"k1","version":1}'


def signed_headers(secret: str, body: bytes, key: str = "k1") -> dict[str, str]:
    timestamp = str(int(SystemClock().now().timestamp()))
    # Contract version 2, computed here independently of the sender's code.
    message = timestamp.encode() + b"\n" + key.encode() + b"\n" + body
    digest = hmac.new(secret.encode(), message, hashlib.sha256)
    return {
        "Idempotency-Key": key,
        "X-Reminders-Timestamp": timestamp,
        "X-Reminders-Signature": f"sha256={digest.hexdigest()}",
    }


def test_a_repeated_idempotency_key_gets_the_first_message_id_and_counts_a_duplicate(http_sink):
    with httpx.Client() as client:
        first = client.post(http_sink.url, content=BODY, headers={"Idempotency-Key": "k1"})
        second = client.post(http_sink.url, content=BODY, headers={"Idempotency-Key": "k1"})
        other = client.post(http_sink.url, content=BODY, headers={"Idempotency-Key": "k2"})

    assert first.json() == {"message_id": "sink-1", "duplicate": False}
    assert second.json() == {"message_id": "sink-1", "duplicate": True}
    assert other.json() == {"message_id": "sink-2", "duplicate": False}
    stats = http_sink.stats()
    assert (stats["requests"], stats["accepted"], stats["duplicates"]) == (3, 2, 1)


def test_signatures_are_verified_when_the_sink_knows_the_secret():
    with HttpSink(secret="s3cret") as sink, httpx.Client() as client:
        good = client.post(sink.url, content=BODY, headers=signed_headers("s3cret", BODY))
        forged = client.post(sink.url, content=BODY, headers=signed_headers("guess", BODY))
        tampered = client.post(
            sink.url, content=BODY + b" ", headers=signed_headers("s3cret", BODY)
        )

        assert [good.status_code, forged.status_code, tampered.status_code] == [200, 401, 401]
        assert sink.stats()["bad_signatures"] == 2


def test_a_request_without_an_idempotency_key_is_refused(http_sink):
    with httpx.Client() as client:
        response = client.post(http_sink.url, content=BODY)

    assert response.status_code == 400
    assert response.json() == {"error": "Idempotency-Key header is required"}


def test_the_server_side_rate_limit_answers_429_beyond_n_per_second(http_sink):
    """Twelve requests at once against five per second: five accepted, seven told to wait."""
    http_sink.configure(rate_limit=5)

    async def burst():
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(
                *(
                    client.post(http_sink.url, content=BODY, headers={"Idempotency-Key": f"k{i}"})
                    for i in range(12)
                )
            )

    responses = asyncio.run(burst())

    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 7
    assert all(int(r.headers["Retry-After"]) >= 1 for r in responses if r.status_code == 429)
    assert http_sink.stats()["max_in_window"] == 12


def test_sixty_concurrent_keep_alive_connections_are_served_in_parallel(http_sink):
    """Sixty slow (0.3 s) requests finish together; a second round reuses the connections."""
    http_sink.configure(delay=0.3)
    clock = SystemClock()

    async def rounds():
        # httpx drops a connection idle past keepalive_expiry (5 s by default): under load a
        # round can take longer than that, and a connection that answered early is reopened.
        limits = httpx.Limits(max_connections=60, max_keepalive_connections=60, keepalive_expiry=60)
        async with httpx.AsyncClient(limits=limits) as client:
            durations = []
            for _ in range(2):
                began = clock.monotonic()
                responses = await asyncio.gather(
                    *(
                        client.post(
                            http_sink.url, content=BODY, headers={"Idempotency-Key": f"k{i}"}
                        )
                        for i in range(60)
                    )
                )
                durations.append(clock.monotonic() - began)
                assert [r.status_code for r in responses] == [200] * 60
            return durations

    durations = asyncio.run(rounds())

    # The proof of parallelism is the peak of 60 in flight below; the time only has to be
    # far from one by one (18 s), whatever else the two cores are running meanwhile (in CI,
    # beside the chaos run, one round took 5.3 s: half of one by one is the bound).
    assert max(durations) < 60 * 0.3 / 2, durations
    stats = http_sink.stats()
    assert stats["peak_in_flight"] == 60
    assert stats["connections_opened"] == 60
    assert stats["duplicates"] == 60


def test_faults_are_configured_at_runtime_over_http(http_sink):
    with httpx.Client(base_url=http_sink.base_url) as client:
        control = client.post(
            "/_control", json={"fail_status": 503, "fail_next": 1, "retry_after": 2}
        )
        failed = client.post("/reminders", content=BODY, headers={"Idempotency-Key": "k1"})
        accepted = client.post("/reminders", content=BODY, headers={"Idempotency-Key": "k1"})
        stats = client.get("/_stats").json()
        unknown = client.post("/_control", json={"colour": "red"})
        client.post("/_reset")
        after_reset = client.get("/_stats").json()

    assert control.json()["fail_status"] == 503
    assert (failed.status_code, failed.headers["Retry-After"]) == (503, "2")
    assert accepted.status_code == 200
    assert stats["statuses"] == {"200": 1, "503": 1}
    assert unknown.status_code == 400
    assert unknown.json() == {"error": "HttpSink has no setting 'colour'."}
    assert after_reset["requests"] == 0


def test_the_sink_runs_as_a_separate_process_controlled_over_http():
    process, line = start_server_process(
        "loopback.http_sink", "--port", "0", "--secret", "s3cret", "--delay", "0.01"
    )
    try:
        assert line.startswith("http_sink listening on http://127.0.0.1:")
        base_url = line.rsplit(" ", 1)[1]
        with httpx.Client(base_url=base_url) as client:
            good = client.post("/reminders", content=BODY, headers=signed_headers("s3cret", BODY))
            unsigned = client.post("/reminders", content=BODY, headers={"Idempotency-Key": "k"})
            stats = client.get("/_stats").json()
    finally:
        code = stop_server_process(process)

    assert (good.status_code, unsigned.status_code) == (200, 401)
    assert (stats["accepted"], stats["bad_signatures"]) == (1, 1)
    assert code == 0


def test_the_arrivals_endpoint_lists_request_times_in_order(http_sink):
    with httpx.Client(base_url=http_sink.base_url) as client:
        for key in ("a", "b"):
            client.post("/reminders", content=BODY, headers={"Idempotency-Key": key})
        arrivals = client.get("/_arrivals").json()["arrivals"]

    assert len(arrivals) == 2
    assert arrivals == sorted(arrivals)
    assert json.loads(http_sink.requests[0].body) == {"key": "k1", "version": 1}


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([], 0),
        ([0.0, 0.5, 0.99], 3),
        ([0.0, 1.0, 2.0], 1),  # exactly one window apart: different windows
        ([0.0, 0.1, 1.05, 1.06, 1.07], 4),
    ],
)
def test_max_in_window_counts_the_busiest_second(times, expected):
    assert max_in_window(times) == expected


def test_a_call_starts_when_its_connection_opens_and_later_ones_at_their_request_line(http_sink):
    # A client frozen between connecting and writing its request had already begun the call.
    clock = SystemClock()
    with socket.create_connection(("127.0.0.1", http_sink.port), timeout=5) as raw:
        wait_until(lambda: http_sink.stats()["connections_opened"] == 1, timeout=5)
        mark = clock.monotonic()
        clock.sleep_blocking(0.05)
        for key in ("a", "b"):
            raw.sendall(
                b"POST /reminders HTTP/1.1\r\nHost: sink\r\nIdempotency-Key: "
                + key.encode()
                + b"\r\nContent-Length: %d\r\n\r\n" % len(BODY)
                + BODY
            )
            assert raw.recv(65536).startswith(b"HTTP/1.1 200")

    first, second = http_sink.call_starts()
    assert first < mark < http_sink.arrivals()[0]
    assert second == http_sink.arrivals()[1]
