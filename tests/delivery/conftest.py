"""Fixtures for the delivery tests: clocks, envelopes, and real loopback servers.

These tests need no database; they run with or without pytest-django.

Pick the clock by what the test waits on: ``fake_clock`` when every wait is
on the clock (memory channel, limiters), ``system_clock`` whenever real I/O
is involved (sockets, threads, files). A FakeClock jumps its virtual time as
soon as all tasks are blocked, and a task blocked on a socket counts as
blocked, so call timeouts would fire in virtual time while the bytes are
still on their way.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from clock import Clock, FakeClock, SystemClock
from delivery import DeliveryLimits, DeliveryResult, Envelope, Session
from loopback.http_sink import HttpSink
from loopback.smtp_sink import SmtpSink

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
CLOCK_TASKS = {"FakeClock.autojump"}


def deliver_once(
    envelopes,
    channel_factory,
    *,
    policy: DeliveryLimits,
    clock: Clock,
    limiter_factory=None,
    **kwargs,
) -> list[DeliveryResult]:
    """Run one batch from synchronous code on a Session of its own, then close it."""
    with Session(
        channel_factory,
        clock=clock,
        limiter_factory=limiter_factory,
        close_timeout=policy.close_timeout,
    ) as session:
        return session.deliver(envelopes, policy=policy, **kwargs)


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on a fresh event loop (no pytest-asyncio here)."""
    return asyncio.run(coroutine)


async def tasks_left() -> list[asyncio.Task]:
    """Return tasks other than the caller and the FakeClock's helper, after a few turns."""
    for _ in range(5):
        await asyncio.sleep(0)
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current and t.get_name() not in CLOCK_TASKS]


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def system_clock() -> SystemClock:
    return SystemClock()


EnvelopeFactory = Callable[..., Envelope]


def envelope_factory(clock: Clock) -> EnvelopeFactory:
    counter = iter(range(1, 1_000_000))

    def make(number: int | None = None, **overrides: Any) -> Envelope:
        number = next(counter) if number is None else number
        fields: dict[str, Any] = {
            "reminder_id": number,
            "key": f"key-{number}",
            "recipient": f"person{number}@example.com",
            "recipient_name": f"Person {number}",
            "subject": "Reminder: Intro to pottery starts soon",
            "text_body": "See you there.",
            "deadline_at": clock.now() + timedelta(hours=1),
            "payload": {"workshop_title": "Intro to pottery"},
        }
        fields.update(overrides)
        return Envelope(**fields)

    return make


@pytest.fixture
def make_envelope(fake_clock: FakeClock) -> EnvelopeFactory:
    """Build envelopes due in an hour on the fake clock."""
    return envelope_factory(fake_clock)


@pytest.fixture
def make_real_envelope(system_clock: SystemClock) -> EnvelopeFactory:
    """Build envelopes due in an hour on the system clock."""
    return envelope_factory(system_clock)


@pytest.fixture
def http_sink() -> Iterator[HttpSink]:
    with HttpSink(secret="test-secret") as sink:
        yield sink


@pytest.fixture(params=[True, False], ids=["pipelining", "no-pipelining"])
def smtp_sink(request) -> Iterator[SmtpSink]:
    """The loopback SMTP server, offering PIPELINING and not: the channel's two paths."""
    with SmtpSink(pipelining=request.param) as sink:
        yield sink


@pytest.fixture
def limiter_redis_url() -> str:
    """Return the Redis the limiter tests use; they fail, not skip, when it is down."""
    return os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def redis_account(limiter_redis_url: str) -> Iterator[str]:
    """Return a unique rate-limit account name and delete its keys afterwards."""
    import redis

    account = f"test-{uuid.uuid4().hex}"
    yield account
    client = redis.Redis.from_url(limiter_redis_url, socket_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"*{{{account}}}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> tuple[str, str]:
    """Return (certificate, key) paths of a throwaway self-signed cert for 127.0.0.1."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture
def server_tls(tls_files):
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls_files)
    return context
