"""Own every reading of time in the project.

Two kinds of time exist here and must not be mixed:

- wall-clock time (``now()``, aware UTC) answers calendar questions: when does
  a workshop start, has a reminder's deadline passed. It may step (NTP), so it
  is never used to measure how long something took.
- monotonic time (``monotonic()``, ``sleep()``, ``timeout()``) answers waiting
  questions: how long to back off, when a provider call has run too long, how
  many calls started in the last second. It never steps, and means nothing as
  a date.

Services take ``clock=`` as a keyword-only argument; ``default_clock()`` gives
the real one. Tests pass a ``FakeClock``, which never reads the host's time,
refuses to go backwards, and runs asyncio sleepers in virtual time.

Where SQL decides by the time, production reads the database server's clock
(``SystemClock.database_now``): one clock for every host. A ``FakeClock``
hands its own ``now()`` to those statements instead, so tests stay
deterministic (reminders.services._sql.database_now).

This is the only module allowed to call ``datetime.now``, ``time.monotonic``,
``time.sleep``, ``asyncio.sleep`` with a delay or the event loop's ``time()``
(ruff's banned-api rule enforces it everywhere else).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "FakeClock", "default_clock", "set_default_clock"]


@runtime_checkable
class Clock(Protocol):
    """What every time-dependent piece of code receives instead of reading time."""

    def now(self) -> datetime:
        """Return the current wall-clock time, aware, in UTC."""

    def monotonic(self) -> float:
        """Return seconds on a clock that never goes backwards."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of monotonic time without blocking the event loop."""

    def sleep_blocking(self, seconds: float) -> None:
        """Wait ``seconds`` in synchronous code (threads, management commands)."""

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[None]:
        """Return a context manager raising ``TimeoutError`` after ``seconds``."""


class SystemClock:
    """The host's clocks: the only production implementation.

    ``database_now``: where a statement decides by the time (a deadline, a
    lease, the window), it reads the database server's clock rather than
    this host's, so that hosts whose clocks disagree still agree.
    """

    database_now = True

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def sleep_blocking(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[None]:
        return asyncio.timeout(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


class _Timer:
    __slots__ = ("when", "seq", "callback", "alive")

    def __init__(self, when: float, seq: int, callback: Callable[[], None]) -> None:
        self.when = when
        self.seq = seq
        self.callback = callback
        self.alive = True

    def __lt__(self, other: _Timer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class FakeClock:
    """A controllable clock for tests.

    ``advance()`` moves both wall and monotonic time forward; ``step_wall()``
    moves only the wall clock (an NTP step), which must not disturb any wait.

    Async waits run in virtual time: when every task is blocked on this clock,
    the clock jumps to the earliest pending wake-up (like Trio's autojump
    ``MockClock``), so a test of a ten-minute backoff finishes in milliseconds.
    ``settle`` is how many event-loop turns the clock lets ready tasks run
    before it decides that they are all waiting on it. Work in other threads
    (``asyncio.to_thread``, file or socket I/O) is invisible to that check:
    with ``autojump=False`` time moves only when the test calls ``advance()``,
    which is what a test of real I/O under a fake calendar needs.
    """

    DEFAULT_START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    # Statements get this clock's ``now()`` as a literal instead of the database's
    # clock: that is how the fake time reaches the SQL that decides.
    database_now = False

    def __init__(
        self, start: datetime | None = None, *, settle: int = 25, autojump: bool = True
    ) -> None:
        start = start or self.DEFAULT_START
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware start time; pass tzinfo=UTC.")
        self._wall_start = start.astimezone(UTC)
        self._wall_step = timedelta(0)
        self._mono = 0.0
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        self._settle = settle
        self.autojump = autojump
        self._jumper: asyncio.Task[None] | None = None

    # -- reading -------------------------------------------------------------

    def now(self) -> datetime:
        return self._wall_start + self._wall_step + timedelta(seconds=self._mono)

    def monotonic(self) -> float:
        return self._mono

    # -- moving --------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move wall and monotonic time forward, firing any wake-up now due."""
        if seconds < 0:
            raise ValueError("FakeClock cannot go backwards; pass seconds >= 0.")
        self._move_to(self._mono + seconds)

    def advance_to(self, moment: datetime) -> None:
        """Move forward until ``now()`` equals ``moment``."""
        self.advance((moment - self.now()).total_seconds())

    def step_wall(self, delta: timedelta) -> None:
        """Step only the wall clock, as NTP may; monotonic waits are unaffected."""
        self._wall_step += delta

    def _move_to(self, target: float) -> None:
        while self._timers and self._timers[0].when <= target:
            timer = heapq.heappop(self._timers)
            if not timer.alive:
                continue
            self._mono = max(self._mono, timer.when)
            timer.callback()
        self._mono = max(self._mono, target)

    # -- waiting -------------------------------------------------------------

    def _call_later(self, seconds: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self._mono + max(0.0, seconds), next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        self._ensure_jumper()
        return timer

    def _ensure_jumper(self) -> None:
        if not self.autojump:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._jumper is None or self._jumper.done():
            self._jumper = loop.create_task(self._autojump(), name="FakeClock.autojump")

    async def _autojump(self) -> None:
        while True:
            for _ in range(self._settle):
                await asyncio.sleep(0)
            while self._timers and not self._timers[0].alive:
                heapq.heappop(self._timers)
            if not self._timers:
                return
            self._move_to(self._timers[0].when)

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self._call_later(seconds, wake)
        try:
            await future
        finally:
            timer.alive = False

    def sleep_blocking(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[None]:
        return _FakeTimeout(self, seconds)

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now().isoformat()}, monotonic={self._mono:.3f})"


class _FakeTimeout:
    """``asyncio.timeout`` whose expiry is driven by a ``FakeClock``."""

    def __init__(self, clock: FakeClock, seconds: float | None) -> None:
        self._clock = clock
        self._seconds = seconds
        self._inner: asyncio.Timeout | None = None
        self._timer: _Timer | None = None

    async def __aenter__(self) -> None:
        self._inner = asyncio.timeout(None)
        await self._inner.__aenter__()
        if self._seconds is not None:
            loop = asyncio.get_running_loop()
            inner = self._inner

            def expire() -> None:
                if inner.expired() or inner.when() is not None:
                    return
                inner.reschedule(loop.time())

            self._timer = self._clock._call_later(self._seconds, expire)

    async def __aexit__(self, exc_type, exc, tb) -> bool | None:
        if self._timer is not None:
            self._timer.alive = False
        assert self._inner is not None
        return await self._inner.__aexit__(exc_type, exc, tb)


_default: Clock = SystemClock()


def default_clock() -> Clock:
    """Return the process-wide clock (the system clock unless a test swapped it)."""
    return _default


def set_default_clock(clock: Clock) -> Clock:
    """Install ``clock`` as the process-wide clock; return the previous one."""
    global _default
    previous, _default = _default, clock
    return previous
