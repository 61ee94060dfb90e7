"""Rate limiters: at most R provider call starts in any window of one second.

Both keep an exact sliding window (a token bucket would let 2R through at a window boundary)
and by default spread starts ``(window + margin) / per_second`` apart, anchored to ideal start
times, so a burst does not reach the provider bunched. ``margin`` stretches our window past the
provider's, which counts arrivals, trailing our starts by network jitter. ``LocalRateLimiter``
serves one event loop; ``RedisRateLimiter`` shares one window between workers.

``acquire`` raises ``DeadlineReached`` when the wait would end at or after the caller's
deadline. ``pause`` is how a 429 slows every caller down.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import uuid
from collections import deque
from datetime import datetime, timedelta
from typing import Protocol

from clock import Clock

__all__ = [
    "RateLimiter",
    "DeadlineReached",
    "LocalRateLimiter",
    "RedisRateLimiter",
    "DEFAULT_MARGIN",
]

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 1.0
DEFAULT_MARGIN = 0.02
# How many starts one Redis round trip may reserve for the callers queued in one process.
DEFAULT_BLOCK = 8
# Seconds late past which a start is moved, in Redis's log, to when it really began (less: noise).
LATE_ENOUGH_TO_MOVE = 0.001


class DeadlineReached(Exception):
    """The wait for a start would end at or after the caller's deadline."""


class RateLimiter(Protocol):
    """What the engine needs from a rate limiter."""

    window: float  # seconds; a 429 without Retry-After pauses every caller this long

    async def acquire(self, *, deadline_at: datetime | None = None) -> None:
        """Wait until one more call may start now; record that it starts."""

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


def _seconds_left(clock: Clock, deadline_at: datetime | None) -> float | None:
    if deadline_at is None:
        return None
    return (deadline_at - clock.now()).total_seconds()


def _refuse_a_wait_past(deadline_at: datetime | None, wait: float, clock: Clock) -> None:
    if deadline_at is not None and clock.now() + timedelta(seconds=max(wait, 0.0)) >= deadline_at:
        raise DeadlineReached(f"the next start is {wait:.3f}s away, at or after the deadline")


class LocalRateLimiter:
    """Limit call starts within one event loop, serving waiters in order (the lock is FIFO)."""

    def __init__(
        self,
        per_second: int,
        *,
        clock: Clock,
        window: float = DEFAULT_WINDOW,
        margin: float = DEFAULT_MARGIN,
        spread: bool = True,
    ) -> None:
        _check_limit(per_second, window, margin)
        self.per_second = per_second
        self.window = window
        self._span = window + margin
        self._interval = self._span / per_second if spread else 0.0
        self._clock = clock
        self._starts: deque[float] = deque()
        self._next_at = -math.inf
        self._paused_until = -math.inf
        self._lock = asyncio.Lock()

    def _wait_needed(self) -> float:
        now = self._clock.monotonic()
        while self._starts and self._starts[0] <= now - self._span:
            self._starts.popleft()
        wait = self._paused_until - now
        if len(self._starts) >= self.per_second:
            wait = max(wait, self._starts[0] + self._span - now)
        if self._interval:
            wait = max(wait, self._next_at - now)
        return wait

    def _record_start(self) -> None:
        now = self._clock.monotonic()
        self._starts.append(now)
        if self._interval:
            on_schedule = now - self._next_at < self._interval
            self._next_at = (self._next_at if on_schedule else now) + self._interval

    async def acquire(self, *, deadline_at: datetime | None = None) -> None:
        left = _seconds_left(self._clock, deadline_at)
        if left is not None and left <= 0:
            raise DeadlineReached("the deadline passed before a start was granted")
        try:
            # The timeout bounds the time spent queueing behind other waiters.
            async with self._clock.timeout(left):
                async with self._lock:
                    while (wait := self._wait_needed()) > 0:
                        _refuse_a_wait_past(deadline_at, wait, self._clock)
                        await self._clock.sleep(wait)
                    self._record_start()
        except TimeoutError:
            raise DeadlineReached("the deadline passed while waiting for a start") from None

    async def pause(self, seconds: float) -> None:
        if seconds > 0:
            self._paused_until = max(self._paused_until, self._clock.monotonic() + seconds)
            logger.info("Rate limiter paused for %.3fs", seconds)

    async def aclose(self) -> None:
        return None


# KEYS[1]: sorted set of start times (µs, Redis TIME), reserved ones included; KEYS[2]:
# pause-until (µs); KEYS[3]: when the next spread start is due (µs). ARGV[1]: starts allowed
# per span; ARGV[2]: span (µs); ARGV[3]: unique member prefix; ARGV[4]: µs between spread
# starts (0: no spreading); ARGV[5]: the longest wait (µs) the first caller accepts (its
# deadline; -1: none); ARGV[6]: starts to reserve (one per caller queued in the process);
# ARGV[7...]: pairs of a member this process reserved earlier and how many µs late it really
# started, so the window counts it when it happened (even if paused).
# Reserves in turn the earliest starts that keep both rules (at most ARGV[1] in any span, at
# least ARGV[4] apart) and returns {1, µs until each}; callers sleep that long and start.
# Returns {0, µs to wait}, reserving nothing, while paused or when the first start would come
# at or after the first caller's deadline.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i = 7, #ARGV, 2 do
  local planned = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if planned then
    redis.call('ZADD', KEYS[1], tonumber(planned) + tonumber(ARGV[i + 1]), ARGV[i])
  end
end
local paused = tonumber(redis.call('GET', KEYS[2]) or '0')
if paused > now then
  return {0, paused - now}
end
local limit = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local interval = tonumber(ARGV[4])
local max_wait = tonumber(ARGV[5])
local wanted = tonumber(ARGV[6])
local slot = now
if interval > 0 then
  local due = tonumber(redis.call('GET', KEYS[3]) or '0')
  if due > slot then slot = due end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - span)
local waits = {1}
for k = 1, wanted do
  if k > 1 then slot = slot + interval end
  if redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.0f', slot - span), '+inf') >= limit then
    local leaving = redis.call('ZRANGE', KEYS[1], -limit, -limit, 'WITHSCORES')
    slot = math.max(slot, tonumber(leaving[2]) + span)
  end
  if k == 1 and max_wait >= 0 and slot - now >= max_wait then
    return {0, math.max(1, slot - now)}
  end
  redis.call('ZADD', KEYS[1], slot, ARGV[3] .. ':' .. k)
  waits[k + 1] = slot - now
end
local ttl = math.ceil((slot - now + span) / 1000) + 1000
redis.call('PEXPIRE', KEYS[1], ttl)
if interval > 0 then
  redis.call('SET', KEYS[3], string.format('%.0f', slot + interval), 'PX', ttl)
end
return waits
"""

# KEYS[1]: pause-until (µs). ARGV[1]: pause length in µs. Never shortens a pause.
_PAUSE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local resume = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if resume > current then
  redis.call('SET', KEYS[1], string.format('%.0f', resume),
             'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
end
return 1
"""


class RedisRateLimiter:
    """Limit call starts across every process that shares ``account`` in Redis.

    Waiters in a process queue on a local lock, so only the head asks Redis, reserving starts
    for up to ``block`` callers in one round trip. A pause after a 429 stops new reservations;
    starts other processes reserved already still go out, the pausing process drops its own.
    The client belongs to the loop it is made in: one limiter per loop, as
    ``Session(limiter_factory=...)`` builds it. With Redis unreachable, ``acquire`` raises.
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
        spread: bool = True,
        socket_timeout: float = 2.0,
        block: int = DEFAULT_BLOCK,
    ) -> None:
        _check_limit(per_second, window, margin)
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"RedisRateLimiter.block must be a whole number >= 1 (got {block!r}).")
        if not url:
            raise ValueError("RedisRateLimiter needs url, e.g. redis://127.0.0.1:6379/0.")
        if not account:
            raise ValueError(
                "RedisRateLimiter needs account: the provider account whose limit is shared."
            )
        self.per_second = per_second
        self.window = window
        self.account = account
        self._span_us = round((window + margin) * 1_000_000)
        self._interval_us = self._span_us // per_second if spread else 0
        self._clock = clock
        self._url = url
        self._socket_timeout = socket_timeout
        # The hash tag keeps both keys in one Redis Cluster slot (one script).
        self.starts_key = f"delivery:ratelimit:{{{account}}}:starts"
        self.pause_key = f"delivery:ratelimit:{{{account}}}:pause"
        self.due_key = f"delivery:ratelimit:{{{account}}}:due"
        self._member_prefix = uuid.uuid4().hex
        self._members = itertools.count()
        self._client = None
        self._acquire_script = None
        self._pause_script = None
        self._lock = asyncio.Lock()
        # (member, µs late) of starts made later than reserved, sent with the next reservation.
        self._late: list[tuple[str, int]] = []
        self._block = block
        # A reserved start over an interval late is dropped: unused starts never fire in a burst.
        self._stale_after = self._span_us / per_second / 1_000_000
        self._pauses = 0  # bumped by pause(): a reservation answered across one is dropped
        #: Starts not made because this process woke for them more than an interval late.
        self.skipped = 0
        # Starts reserved for this process and not taken yet: (member, monotonic start).
        self._ready: deque[tuple[str, float]] = deque()
        self._queued = 0  # callers waiting for the lock

    def _scripts(self):
        if self._client is None:
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(
                self._url,
                socket_timeout=self._socket_timeout,
                socket_connect_timeout=self._socket_timeout,
            )
            self._acquire_script = self._client.register_script(_ACQUIRE)
            self._pause_script = self._client.register_script(_PAUSE)
        return self._acquire_script, self._pause_script

    async def acquire(self, *, deadline_at: datetime | None = None) -> None:
        acquire_script, _ = self._scripts()
        left = _seconds_left(self._clock, deadline_at)
        if left is not None and left <= 0:
            raise DeadlineReached("the deadline passed before a start was granted")
        self._queued += 1
        queued = True
        try:
            async with self._clock.timeout(left):
                async with self._lock:
                    self._queued -= 1
                    queued = False
                    if not self._ready and not self._queued:
                        # Callers started together (a chunk's) reach the lock a loop turn
                        # apart: let them queue first, so one round trip reserves for all.
                        await asyncio.sleep(0)
                    may_skip = True
                    while True:
                        self._drop_stale()
                        if self._ready:
                            if await self._take_reserved(deadline_at, may_skip=may_skip):
                                return
                            may_skip = False  # once: a host late at every wake still sends
                            continue
                        wait = await self._reserve(acquire_script, deadline_at)
                        if wait is None:
                            continue
                        _refuse_a_wait_past(deadline_at, wait, self._clock)
                        await self._clock.sleep(wait)  # paused: ask again when it ends
        except TimeoutError:
            raise DeadlineReached("the deadline passed while waiting for a start") from None
        finally:
            if queued:
                self._queued -= 1

    async def _reserve(self, acquire_script, deadline_at: datetime | None) -> float | None:
        """Reserve a start for this caller and for each caller queued behind it (one round trip).

        Return None once the starts are in ``_ready``, else the seconds to wait: paused, or the
        first start would come at or after ``deadline_at``.
        """
        member = f"{self._member_prefix}:{next(self._members)}"
        left = _seconds_left(self._clock, deadline_at)
        max_wait = -1 if left is None else max(0, math.floor(left * 1_000_000))
        late, self._late = self._late, []
        wanted = min(self._block, 1 + self._queued)
        pauses = self._pauses
        try:
            granted, *waits_us = await acquire_script(
                keys=[self.starts_key, self.pause_key, self.due_key],
                args=[
                    self.per_second, self._span_us, member, self._interval_us, max_wait, wanted,
                    *(value for pair in late for value in pair),
                ],
            )  # fmt: skip
        except BaseException:
            self._late = late + self._late  # not applied: send them with the next call
            raise
        answered = self._clock.monotonic()
        if not int(granted):
            return int(waits_us[0]) / 1_000_000
        if self._pauses != pauses:
            # A 429 came while this reservation was on its way: start none of it.
            return 0.0
        for index, wait_us in enumerate(waits_us, start=1):
            self._ready.append((f"{member}:{index}", answered + int(wait_us) / 1_000_000))
        return None

    async def _take_reserved(self, deadline_at: datetime | None, *, may_skip: bool) -> bool:
        """Take the oldest start reserved for this process, sleep until it; False if not made.

        A caller whose deadline comes first leaves it to the next. A start made late is moved,
        with the next reservation, to when it happened; one over an interval late (if
        ``may_skip``) is not made, as it would bunch with the on-time starts reserved after it.
        """
        member, start_at = self._ready[0]
        wait = start_at - self._clock.monotonic()
        _refuse_a_wait_past(deadline_at, wait, self._clock)
        self._ready.popleft()
        if wait > 0:
            await self._clock.sleep(wait)
        late = self._clock.monotonic() - start_at
        if may_skip and late > self._stale_after:
            self.skipped += 1
            return False
        if late > LATE_ENOUGH_TO_MOVE:
            self._late.append((member, round(late * 1_000_000)))
            del self._late[:-64]  # a bounded list: the oldest corrections matter least
        return True

    def _drop_stale(self) -> None:
        """Forget reserved starts whose time passed more than one interval ago (left unused)."""
        now = self._clock.monotonic()
        while self._ready and self._ready[0][1] < now - self._stale_after:
            self._ready.popleft()

    async def pause(self, seconds: float) -> None:
        if seconds <= 0:
            return
        _, pause_script = self._scripts()
        # The provider said slow down: drop the starts reserved ahead; a reservation still on
        # its way sees ``_pauses`` move and drops its own.
        self._pauses += 1
        self._ready.clear()
        await pause_script(keys=[self.pause_key], args=[round(seconds * 1_000_000)])
        logger.info("Rate limiter %s paused for %.3fs", self.account, seconds)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if self.skipped:
            logger.info(
                "Rate limiter %s: %s reserved starts not made, this process woke for them "
                "more than %.1f ms late (a busy host; each costs the rate one interval)",
                self.account,
                self.skipped,
                self._stale_after * 1000,
            )
            self.skipped = 0
        if client is not None:
            await client.aclose()
