"""A fixed-window request limit per API token, counted in Django's cache.

The cache is Redis in production (config.settings: the broker's server), so
every web process counts against the same window; ``incr`` is atomic there.
"""

from __future__ import annotations

import logging
import math

from django.conf import settings
from django.core.cache import cache
from redis.exceptions import RedisError

from clock import default_clock

logger = logging.getLogger(__name__)


class RateLimited(Exception):
    def __init__(self, *, limit: int, window: int, retry_after: int) -> None:
        super().__init__(f"more than {limit} requests in {window} s")
        self.limit = limit
        self.window = window
        self.retry_after = retry_after


def parse_rate(text: str) -> tuple[int, int]:
    """'600/minute' -> (600, 60). Units: second, minute, hour."""
    count, _, unit = text.partition("/")
    seconds = {"second": 1, "minute": 60, "hour": 3600}.get(unit.strip().rstrip("s"))
    if not count.strip().isdigit() or int(count) < 1 or seconds is None:
        raise ValueError(
            f"REMINDERS_API_RATE must look like '600/minute' (a count per second, minute or "
            f"hour), not {text!r}."
        )
    return int(count), seconds


def rate_check(token) -> None:
    """Count one request of ``token``; raise RateLimited past the limit of this window."""
    limit, window = parse_rate(settings.REMINDERS_API_RATE)
    now = default_clock().now().timestamp()
    start = math.floor(now / window) * window
    # The digest, not the id: a token's count never carries over to another one.
    key = f"api-rate:{token.digest[:24]}:{int(start)}"
    try:
        cache.add(key, 0, timeout=window + 1)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=window + 1)
            count = 1
    except (RedisError, OSError) as error:
        # The limit guards the service, not the data: with the cache unreachable the
        # request is served, as the admin would be, and the outage is logged.
        logger.warning("API rate limit not counted (the cache is unreachable: %s)", error)
        return
    if count > limit:
        raise RateLimited(
            limit=limit, window=window, retry_after=max(1, math.ceil(start + window - now))
        )
