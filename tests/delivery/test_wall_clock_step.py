"""T9: a step of the host's wall clock (NTP) does not change any wait: waits are monotonic."""

import asyncio
from datetime import timedelta

import pytest

from delivery import DeliveryLimits, Outcome, deliver
from delivery.errors import TransientError
from tests.support.memory_channel import MemoryChannel

from .conftest import run


async def _step_wall_while(clock, coroutine, *, after: float, step: timedelta):
    """Run ``coroutine``; once ``after`` monotonic seconds passed, step the wall clock."""

    async def stepper():
        await clock.sleep(after)
        clock.step_wall(step)

    async with asyncio.TaskGroup() as group:
        stepping = group.create_task(stepper())
        result = await coroutine
        stepping.cancel()
    return result


@pytest.mark.parametrize("step", [timedelta(hours=-2), timedelta(minutes=10)])
def test_backoff_waits_the_same_monotonic_time_when_the_wall_clock_steps(
    fake_clock, make_envelope, step
):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()  # deadline hours away: a 10-minute step does not reach it
    channel.fail(envelope.key, TransientError("busy"), TransientError("busy"))
    policy = DeliveryLimits(max_attempts=3, backoff_base=4, backoff_max=60, jitter=0)
    batch = deliver([envelope], channel, policy=policy, clock=fake_clock, random=lambda: 0.0)

    [result] = run(_step_wall_while(fake_clock, batch, after=1, step=step))

    assert result.outcome is Outcome.SENT
    assert channel.start_times == pytest.approx([0.0, 4.0, 12.0])


def test_call_timeout_fires_after_the_same_monotonic_time_when_the_wall_clock_steps_back(
    fake_clock, make_envelope
):
    channel = MemoryChannel(clock=fake_clock, honours_idempotency_keys=False)
    envelope = make_envelope()
    channel.slow(envelope.key, 600)
    policy = DeliveryLimits(call_timeout=5, max_attempts=1)
    batch = deliver([envelope], channel, policy=policy, clock=fake_clock)

    [result] = run(_step_wall_while(fake_clock, batch, after=1, step=timedelta(hours=-1)))

    assert result.outcome is Outcome.TIMED_OUT
    assert fake_clock.monotonic() == pytest.approx(5.0, abs=0.01)
