"""The one owner of time: the fake clock's guarantees that every other test relies on."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from clock import Clock, FakeClock, SystemClock, default_clock


def test_fake_clock_refuses_to_go_backwards():
    fake = FakeClock()
    with pytest.raises(ValueError, match="cannot go backwards"):
        fake.advance(-1)


def test_fake_clock_needs_an_aware_start():
    with pytest.raises(ValueError, match="aware"):
        FakeClock(datetime(2026, 1, 1))


def test_advance_moves_wall_and_monotonic_together():
    fake = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    fake.advance(90)
    assert fake.now() == datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)
    assert fake.monotonic() == 90


def test_wall_step_leaves_monotonic_waits_alone():
    """An NTP step moves now() but neither monotonic() nor a pending sleep (T9)."""
    fake = FakeClock()

    async def main():
        task = asyncio.create_task(fake.sleep(10))
        await asyncio.sleep(0)
        fake.step_wall(timedelta(hours=-2))
        await task
        return fake.monotonic()

    assert asyncio.run(main()) == 10
    assert fake.now() == FakeClock.DEFAULT_START - timedelta(hours=2) + timedelta(seconds=10)


def test_concurrent_sleeps_run_in_virtual_time_without_adding_up():
    fake = FakeClock()
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float):
        await fake.sleep(seconds)
        woke.append((name, fake.monotonic()))

    async def main():
        async with asyncio.TaskGroup() as group:
            group.create_task(nap("long", 600))
            group.create_task(nap("short", 2))
            group.create_task(nap("middle", 5))

    asyncio.run(main())
    assert woke == [("short", 2), ("middle", 5), ("long", 600)]


def test_fake_timeout_raises_timeout_error_at_its_virtual_deadline():
    fake = FakeClock()

    async def main():
        with pytest.raises(TimeoutError):
            async with fake.timeout(3):
                await fake.sleep(100)
        return fake.monotonic()

    assert asyncio.run(main()) == 3


def test_system_and_fake_clocks_satisfy_the_protocol():
    assert isinstance(SystemClock(), Clock)
    assert isinstance(FakeClock(), Clock)
    assert default_clock().now().tzinfo is UTC
