import pytest
import redis

from clock import SystemClock
from loopback.smtp_sink import SmtpSink


@pytest.fixture
def live_clock(clock):
    """The fake clock moved to the real present: worker processes read the real clock.

    It moves only when the test says so, which is how a test lets a lease
    expire without waiting for it.
    """
    clock.autojump = False
    clock.advance_to(SystemClock().now())
    return clock


@pytest.fixture
def broker(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield redis_url
    client.flushdb()


@pytest.fixture
def smtp_sink():
    with SmtpSink() as sink:
        yield sink
