import pytest
import redis

from loopback.smtp_sink import SmtpSink


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
