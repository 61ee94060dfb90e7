"""Rate limiters: at most ``per_second`` provider call starts in any window of one second.

Both are GCRA with no burst: starts are spread evenly, one every
``(window + margin) / per_second`` seconds, each reserving the next free
slot. The provider counts arrivals, which trail our starts by jitter; the
``margin`` covers it. A start whose process wakes for it more than half the
margin late is not made (the caller reserves again, once), so a stalled
process cannot bunch a late start with the on-time ones after it.

Both raise ``DeadlineReached`` from ``acquire`` when the start would come at
or after the caller's deadline, without sleeping through it. ``pause`` is how
a 429 holds every caller back.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from clock import Clock

__all__ = ["RateLimiter", "DeadlineReached", "LocalRateLimiter", "RedisRateLimiter"]

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 1.0
DEFAULT_MARGIN = 0.02
# How many starts one Redis round trip may reserve for the callers queued in one process.
DEFAULT_BLOCK = 8
# How long a 429 without Retry-After pauses the limiter, in windows.
DEFAULT_PAUSE_WINDOWS = 1.0


class DeadlineReached(Exception):
    """The wait for a start would end at or after the caller's deadline."""


@runtime_checkable
class RateLimiter(Protocol):
    """What the engine needs from a rate limiter."""

    async def acquire(self, *, deadline_at: datetime | None = None) -> None:
        """Wait until one more call may start now."""

    async def pause(self, seconds: float) -> None:
        """Let no call start for ``seconds`` (the provider asked us to back off)."""

    async def aclose(self) -> None:
        """Release connections."""


def _check_limit(per_second: object, window: object, margin: object) -> None:
    if not isinstance(per_second, int) or isinstance(per_second, bool) or per_second < 1:
        raise ValueError(
            f"per_second must be an integer >= 1 (got {per_second!r}); it counts call starts "
            "per window."
        )
    if not isinstance(window, int | float) or not math.isfinite(window) or window <= 0:
        raise ValueError(f"window must be a positive number of seconds (got {window!r}).")
    if not isinstance(margin, int | float) or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a number of seconds >= 0 (got {margin!r}).")


class _Spread:
    """What both limiters share: the interval, the lateness allowed, the deadline check."""

    def __init__(self, per_second: int, *, clock: Clock, window: float, margin: float) -> None:
        _check_limit(per_second, window, margin)
        self.per_second = per_second
        self.window = window
        self.interval = (window + margin) / per_second
        self._late_limit = margin / 2
        self._clock = clock
        self._lock = asyncio.Lock()
        #: Starts not made because this process woke for them too late.
        self.skipped = 0

    def _seconds_left(self, deadline_at: datetime | None) -> float | None:
        if deadline_at is None:
            return None
        left = (deadline_at - self._clock.now()).total_seconds()
        if left <= 0:
            raise DeadlineReached("the deadline passed before a start was granted")
        return left

    def _refuse_after(self, deadline_at: datetime | None, wait: float) -> None:
        if deadline_at is not None and (
            self._clock.now() + timedelta(seconds=max(wait, 0.0)) >= deadline_at
        ):
            raise DeadlineReached(f"the next start is {wait:.3f}s away, at or after the deadline")

    async def _start_at(self, start_at: float, *, may_skip: bool) -> bool:
        """Sleep until ``start_at`` (monotonic); return False if woken too late to start."""
        wait = start_at - self._clock.monotonic()
        if wait > 0:
            await self._clock.sleep(wait)
        if may_skip and self._clock.monotonic() - start_at > self._late_limit:
            self.skipped += 1
            return False
        return True


class LocalRateLimiter(_Spread):
    """Limit call starts within one event loop; waiters are served first come, first served.

    For a single process (the local run without Redis, tests); ``RedisRateLimiter``
    shares one limit between processes.
    """

    def __init__(
        self,
        per_second: int,
        *,
        clock: Clock,
        window: float = DEFAULT_WINDOW,
        margin: float = DEFAULT_MARGIN,
    ) -> None:
        super().__init__(per_second, clock=clock, window=window, margin=margin)
        self._next = -math.inf
        self._paused_until = -math.inf

    async def acquire(self, *, deadline_at: datetime | None = None) -> None:
        left = self._seconds_left(deadline_at)
        try:
            async with self._clock.timeout(left), self._lock:
                now = self._clock.monotonic()
                start_at = max(self._next, self._paused_until, now)
                self._refuse_after(deadline_at, start_at - now)
                if start_at > now:
                    await self._clock.sleep(start_at - now)
                # A wake later than the margin allows moves the schedule with it.
                late = self._clock.monotonic() - self._late_limit
                self._next = max(start_at, late) + self.interval
        except TimeoutError:
            raise DeadlineReached("the deadline passed while waiting for a start") from None

    async def pause(self, seconds: float) -> None:
        if seconds > 0:
            self._paused_until = max(self._paused_until, self._clock.monotonic() + seconds)
            logger.info("Rate limiter paused for %.3fs", seconds)

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"LocalRateLimiter(per_second={self.per_second}, window={self.window})"


# KEYS[1]: the next free start (µs, Redis TIME); KEYS[2]: no start before this (a pause).
# ARGV[1]: µs between starts; ARGV[2]: starts to reserve; ARGV[3]: the longest wait the
# first caller accepts in µs (-1: none). Returns {1, µs until each reserved start}, or
# {0, µs to wait} with nothing reserved (paused, or past the first caller's deadline).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local paused = tonumber(redis.call('GET', KEYS[2]) or '0')
if paused > now then
  return {0, paused - now}
end
local slot = math.max(now, tonumber(redis.call('GET', KEYS[1]) or '0'))
local max_wait = tonumber(ARGV[3])
if max_wait >= 0 and slot - now >= max_wait then
  return {0, math.max(1, slot - now)}
end
local waits = {1}
for k = 1, tonumber(ARGV[2]) do
  waits[k + 1] = slot - now
  slot = slot + tonumber(ARGV[1])
end
redis.call('SET', KEYS[1], string.format('%.0f', slot), 'PX', math.ceil((slot - now) / 1000) + 1000)
return waits
"""

# KEYS[1]: no start before this (µs). ARGV[1]: pause length in µs. Never shortens a pause.
_PAUSE = """
local t = redis.call('TIME')
local resume = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
if resume > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], string.format('%.0f', resume),
             'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
end
return 1
"""


class RedisRateLimiter(_Spread):
    """Limit call starts across every process that shares ``account`` in Redis.

    One atomic script on Redis's clock hands out the slots, so hosts with
    different clocks agree. Within a process, one round trip reserves a slot
    for each caller queued (up to ``block``). A pause set by one worker (a
    429) stops every new reservation; the process that saw it drops the
    slots it had reserved. The client belongs to the event loop that first
    uses it; if Redis is unreachable ``acquire`` raises and the engine counts
    a transient failure that never reached the provider.
    """

    def __init__(
        self,
        *,
        url: str,
        account: str,
        per_second: int,
        clock: Clock,
        window: float = DEFAULT_WINDOW,
        margin: float = DEFAULT_MARGIN,
        key_prefix: str = "delivery:ratelimit",
        socket_timeout: float = 2.0,
        block: int = DEFAULT_BLOCK,
    ) -> None:
        super().__init__(per_second, clock=clock, window=window, margin=margin)
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"RedisRateLimiter.block must be a whole number >= 1 (got {block!r}).")
        if not url:
            raise ValueError("RedisRateLimiter needs url, e.g. redis://127.0.0.1:6379/0.")
        if not account:
            raise ValueError(
                "RedisRateLimiter needs account: the provider account whose limit is shared."
            )
        self.account = account
        self._url = url
        self._socket_timeout = socket_timeout
        self._block = block
        # The hash tag keeps both keys in one Redis Cluster slot (one script).
        self.next_key = f"{key_prefix}:{{{account}}}:next"
        self.pause_key = f"{key_prefix}:{{{account}}}:pause"
        self._client = None
        self._scripts: tuple = ()
        self._ready: deque[float] = deque()  # monotonic times of slots reserved, not taken
        self._queued = 0  # callers waiting for the lock
        self._pauses = 0  # bumped by pause(): a reservation answered across one is dropped

    def _script(self, index: int):
        if self._client is None:
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(
                self._url,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
            )
            self._scripts = tuple(self._client.register_script(s) for s in (_ACQUIRE, _PAUSE))
        return self._scripts[index]

    async def acquire(self, *, deadline_at: datetime | None = None) -> None:
        left = self._seconds_left(deadline_at)
        self._queued += 1
        queued = True
        try:
            async with self._clock.timeout(left), self._lock:
                self._queued -= 1
                queued = False
                if not self._ready and not self._queued:
                    # A chunk's callers reach the lock a loop turn apart: let them
                    # queue, so one round trip reserves for all of them.
                    await asyncio.sleep(0)
                may_skip = True
                while True:
                    now = self._clock.monotonic()
                    while self._ready and self._ready[0] < now - self._late_limit:
                        self._ready.popleft()  # nobody could take it on time
                    if not self._ready:
                        wait = await self._reserve(deadline_at)
                        if wait:
                            self._refuse_after(deadline_at, wait)
                            await self._clock.sleep(wait)  # paused: ask again when it ends
                        continue
                    self._refuse_after(deadline_at, self._ready[0] - now)
                    if await self._start_at(self._ready.popleft(), may_skip=may_skip):
                        return
                    may_skip = False
        except TimeoutError:
            raise DeadlineReached("the deadline passed while waiting for a start") from None
        finally:
            if queued:
                self._queued -= 1

    async def _reserve(self, deadline_at: datetime | None) -> float:
        """Reserve slots for this caller and those queued behind it; return 0, or how long to wait."""
        left = None if deadline_at is None else (deadline_at - self._clock.now()).total_seconds()
        max_wait = -1 if left is None else max(0, math.floor(left * 1_000_000))
        pauses = self._pauses
        granted, *waits_us = await self._script(0)(
            keys=[self.next_key, self.pause_key],
            args=[round(self.interval * 1_000_000), min(self._block, 1 + self._queued), max_wait],
        )
        if not int(granted):
            return int(waits_us[0]) / 1_000_000
        if self._pauses == pauses:  # else a 429 came meanwhile: take none of them
            answered = self._clock.monotonic()
            self._ready.extend(answered + int(us) / 1_000_000 for us in waits_us)
        return 0.0

    async def pause(self, seconds: float) -> None:
        if seconds <= 0:
            return
        # Before and after: a reservation may reach Redis before the pause does.
        self._pauses += 1
        self._ready.clear()
        await self._script(1)(keys=[self.pause_key], args=[round(seconds * 1_000_000)])
        self._pauses += 1
        self._ready.clear()
        logger.info("Rate limiter %s paused for %.3fs", self.account, seconds)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if self.skipped:
            logger.info(
                "Rate limiter %s: %s reserved starts not made, this process woke for them "
                "more than %.1f ms late (a busy host)",
                self.account,
                self.skipped,
                self._late_limit * 1000,
            )
            self.skipped = 0
        if client is not None:
            await client.aclose()

    def __repr__(self) -> str:
        return f"RedisRateLimiter(account={self.account!r}, per_second={self.per_second})"
