"""Rate limiters: sliding windows on a FakeClock, and one window shared through real Redis."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import timedelta

import pytest

from clock import SystemClock
from delivery import DeliveryPolicy, Outcome, deliver
from delivery.channels import MemoryChannel
from delivery.limiter import DeadlineReached, LocalRateLimiter, RedisRateLimiter
from loopback.windows import max_in_window
from tests.delivery.conftest import run

pytestmark = pytest.mark.timeout(30)


def record_starts(limiter, clock, callers: int) -> list[float]:
    """Run ``callers`` concurrent acquires; return when each was granted."""
    starts: list[float] = []

    async def caller():
        await limiter.acquire()
        starts.append(clock.monotonic())

    async def scenario():
        async with asyncio.TaskGroup() as group:
            for _ in range(callers):
                group.create_task(caller())

    run(scenario())
    return starts


def test_local_limiter_spreads_starts_evenly_and_never_exceeds_r_per_window(fake_clock):
    """A hundred concurrent callers at ten per second start 0.102 s apart."""
    starts = record_starts(LocalRateLimiter(10, clock=fake_clock), fake_clock, 100)

    assert len(starts) == 100
    assert max_in_window(starts) == 10
    assert starts == pytest.approx([index * 0.102 for index in range(100)])


def test_without_spreading_the_window_admits_bursts_of_r(fake_clock):
    """Ten at once, then the next ten one window (plus margin) later."""
    limiter = LocalRateLimiter(10, clock=fake_clock, spread=False)

    starts = record_starts(limiter, fake_clock, 30)

    assert max_in_window(starts) == 10
    assert starts == pytest.approx([0.0] * 10 + [1.02] * 10 + [2.04] * 10)


def test_local_limiter_refuses_a_wait_that_would_cross_the_deadline(fake_clock):
    """The refusal is immediate: no sleeping towards a deadline that cannot be met."""
    limiter = LocalRateLimiter(1, clock=fake_clock)

    async def scenario():
        await limiter.acquire()
        with pytest.raises(DeadlineReached, match="at or after the deadline"):
            await limiter.acquire(deadline_at=fake_clock.now() + timedelta(seconds=0.5))

    run(scenario())

    assert fake_clock.monotonic() == 0.0


def test_local_limiter_gives_up_queueing_at_the_deadline(fake_clock):
    """Queued behind another waiter, a caller due in 0.5 s gives up at 0.5 s."""
    limiter = LocalRateLimiter(1, clock=fake_clock)
    events: list[tuple[str, float]] = []

    async def patient():
        await limiter.acquire()
        events.append(("patient granted", fake_clock.monotonic()))

    async def hurried():
        try:
            await limiter.acquire(deadline_at=fake_clock.now() + timedelta(seconds=0.5))
        except DeadlineReached:
            events.append(("hurried gave up", fake_clock.monotonic()))

    async def scenario():
        await limiter.acquire()
        async with asyncio.TaskGroup() as group:
            group.create_task(patient())
            group.create_task(hurried())

    run(scenario())

    assert events == [("hurried gave up", 0.5), ("patient granted", pytest.approx(1.02))]


def test_a_cancelled_acquire_records_no_start(fake_clock):
    """A waiter cancelled at 0.1 s leaves its place; the next caller is granted at 1.02 s."""
    limiter = LocalRateLimiter(1, clock=fake_clock)

    async def scenario():
        await limiter.acquire()
        waiter = asyncio.create_task(limiter.acquire())
        await fake_clock.sleep(0.1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await limiter.acquire()
        granted_at = fake_clock.monotonic()
        with pytest.raises(DeadlineReached):
            await limiter.acquire(deadline_at=fake_clock.now() + timedelta(seconds=0.5))
        return granted_at

    assert run(scenario()) == pytest.approx(1.02)


def test_a_pause_holds_every_start_until_it_ends(fake_clock):
    limiter = LocalRateLimiter(100, clock=fake_clock)

    async def scenario():
        await limiter.pause(3.0)
        await limiter.acquire()
        return fake_clock.monotonic()

    assert run(scenario()) == 3.0


@pytest.mark.parametrize(
    ("per_second", "message"),
    [(0, "per_second must be an integer >= 1 (got 0)"), (2.5, "per_second must be an integer")],
)
def test_a_limiter_needs_a_whole_number_of_starts(fake_clock, per_second, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LocalRateLimiter(per_second, clock=fake_clock)


# -- Redis ---------------------------------------------------------------------


def test_redis_limiter_shares_one_window_between_event_loops_in_two_threads(
    limiter_redis_url, redis_account
):
    """Two workers with their own loops share ten starts per quarter second, not twenty."""
    clock = SystemClock()
    starts: list[tuple[str, float]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        async def main():
            limiter = RedisRateLimiter(
                url=limiter_redis_url,
                account=redis_account,
                per_second=10,
                window=0.25,
                margin=0.01,
                clock=clock,
            )
            try:

                async def one():
                    await limiter.acquire()
                    with lock:
                        starts.append((name, clock.monotonic()))

                async with asyncio.TaskGroup() as group:
                    for _ in range(30):
                        group.create_task(one())
            finally:
                await limiter.aclose()

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert errors == []
    times = sorted(moment for _, moment in starts)
    assert len(times) == 60
    assert {name for name, _ in starts} == {"a", "b"}
    assert max_in_window(times, window=0.25) <= 10
    # Sixty starts at ten per window take at least five windows after the first burst.
    assert times[-1] - times[0] >= 5 * 0.25


def test_a_redis_pause_set_by_one_worker_holds_back_another(limiter_redis_url, redis_account):
    clock = SystemClock()

    async def scenario():
        first = RedisRateLimiter(
            url=limiter_redis_url, account=redis_account, per_second=100, clock=clock
        )
        second = RedisRateLimiter(
            url=limiter_redis_url, account=redis_account, per_second=100, clock=clock
        )
        try:
            await first.pause(0.3)
            began = clock.monotonic()
            await second.acquire()
            return clock.monotonic() - began
        finally:
            await first.aclose()
            await second.aclose()

    assert run(scenario()) >= 0.29


def test_redis_limiter_refuses_a_wait_past_the_deadline(limiter_redis_url, redis_account):
    clock = SystemClock()

    async def scenario():
        limiter = RedisRateLimiter(
            url=limiter_redis_url, account=redis_account, per_second=1, window=10, clock=clock
        )
        try:
            await limiter.acquire()
            began = clock.monotonic()
            with pytest.raises(DeadlineReached, match="at or after the deadline"):
                await limiter.acquire(deadline_at=clock.now() + timedelta(seconds=1))
            return clock.monotonic() - began
        finally:
            await limiter.aclose()

    assert run(scenario()) < 0.5


def test_an_unreachable_redis_is_a_transient_result_that_never_reached_the_provider(
    make_real_envelope,
):
    """The limiter cannot grant starts, so nothing is sent, and the batch still returns."""
    clock = SystemClock()
    channel = MemoryChannel(clock=clock)
    limiter = RedisRateLimiter(
        url="redis://127.0.0.1:1/0", account="down", per_second=5, clock=clock, socket_timeout=0.5
    )
    policy = DeliveryPolicy(max_attempts=2, backoff_base=0.01)

    async def scenario():
        try:
            return await deliver(
                [make_real_envelope()], channel, policy=policy, clock=clock, limiter=limiter
            )
        finally:
            await limiter.aclose()

    [result] = run(scenario())

    assert result.outcome is Outcome.TRANSIENT
    assert (result.attempts, result.provider_reached) == (0, False)
    assert "rate limiter unavailable" in result.error
    assert channel.calls == []
