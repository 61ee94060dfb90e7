"""At the budget, calls already in flight may finish (drain); nothing new starts."""

import pytest

from delivery import DeliveryLimits, Outcome, deliver
from tests.support.memory_channel import MemoryChannel

from .conftest import run, tasks_left


def test_calls_in_flight_finish_during_the_drain_and_waiting_ones_never_start(
    fake_clock, make_envelope
):
    """Budget 3 s, drain 10 s, one slot: the 5-second call ends sent, the next never starts."""
    channel = MemoryChannel(clock=fake_clock, honours_idempotency_keys=False)
    first, second = make_envelope(), make_envelope()
    channel.slow(first.key, 5)
    policy = DeliveryLimits(concurrency=1, call_timeout=30, budget=3, drain=10)

    async def scenario():
        results = await deliver([first, second], channel, policy=policy, clock=fake_clock)
        return results, await tasks_left()

    (sent, never), leftover = run(scenario())

    assert sent.outcome is Outcome.SENT
    assert never.outcome is Outcome.CANCELLED
    assert (never.attempts, never.provider_reached) == (0, False)
    assert [call.key for call in channel.calls] == [first.key]
    assert fake_clock.monotonic() == pytest.approx(5.0)
    assert leftover == []


def test_a_call_outlasting_the_drain_is_cut_off_and_says_it_may_have_arrived(
    fake_clock, make_envelope
):
    channel = MemoryChannel(clock=fake_clock, honours_idempotency_keys=False)
    envelope = make_envelope()
    channel.hang(envelope.key)
    policy = DeliveryLimits(call_timeout=60, budget=3, drain=2)

    [result] = run(deliver([envelope], channel, policy=policy, clock=fake_clock))

    assert result.outcome is Outcome.CANCELLED
    assert result.maybe_delivered is True
    assert fake_clock.monotonic() == pytest.approx(5.0)


def test_drain_must_not_be_negative():
    with pytest.raises(ValueError, match="drain"):
        DeliveryLimits(drain=-1)
