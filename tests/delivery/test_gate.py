"""The engine's gate and deadlines for envelopes already claimed: nothing starts once withdrawn.

Every in-flight case the claim cannot see: an envelope waiting in the rate
limiter, one backing off between tries, a call that would run past the
deadline, a stop while calls are in flight.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from delivery import DeliveryLimits, Outcome, TransientError, deliver
from delivery.gate import Gate
from delivery.limiter import LocalRateLimiter
from tests.delivery.conftest import run
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)

POLICY = DeliveryLimits(concurrency=10, call_timeout=10, max_attempts=3, backoff_base=10, jitter=0)


def _publisher(gate: Gate, clock, plan: dict[float, dict[int, str]], *, every: float = 0.25):
    """Publish fresh snapshots every ``every`` s; from each time in ``plan``, its withdrawals."""

    async def publish():
        withdrawn: dict[int, str] = {}
        while True:
            now = clock.monotonic()
            for at, more in plan.items():
                if now >= at:
                    withdrawn.update(more)
            gate.publish(withdrawn, taken_at=now)
            await clock.sleep(every)

    return publish


def _deliver_with(gate, publisher, envelopes, channel, clock, **kwargs):
    async def scenario():
        task = asyncio.create_task(publisher())
        try:
            return await deliver(envelopes, channel, clock=clock, gate=gate, **kwargs)
        finally:
            task.cancel()

    return run(scenario())


def test_envelopes_waiting_in_the_limiter_are_withdrawn_without_a_call(fake_clock, make_envelope):
    """Five envelopes at one start per second; the workshop is cancelled at 2.5 s. The
    two still waiting in the limiter then are never called."""
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(5)]
    gate = Gate(max_age=1.0, clock=fake_clock)
    cancelled = {e.reminder_id: "workshop cancelled" for e in envelopes}
    publisher = _publisher(gate, fake_clock, {2.5: cancelled})
    limiter = LocalRateLimiter(1, clock=fake_clock)

    results = _deliver_with(
        gate, publisher, envelopes, channel, fake_clock, policy=POLICY, limiter=limiter
    )

    outcomes = [r.outcome for r in results]
    assert outcomes[:3] == [Outcome.SENT] * 3
    assert outcomes[3:] == [Outcome.WITHDRAWN] * 2
    assert [len(channel.calls_for(e.key)) for e in envelopes] == [1, 1, 1, 0, 0]
    assert all(start <= 2.5 + gate.max_age for start in channel.start_times)
    assert results[4].error == "withdrawn before the call: workshop cancelled"
    assert (results[4].attempts, results[4].provider_reached) == (0, False)


def test_an_envelope_backing_off_is_withdrawn_before_its_next_try(fake_clock, make_envelope):
    """A 503, a ten-second backoff, and the enrollment cancelled at 3 s: no second call."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("HTTP 503"))
    gate = Gate(max_age=1.0, clock=fake_clock)
    publisher = _publisher(gate, fake_clock, {3.0: {envelope.reminder_id: "enrollment cancelled"}})

    [result] = _deliver_with(gate, publisher, [envelope], channel, fake_clock, policy=POLICY)

    assert result.outcome is Outcome.WITHDRAWN
    assert len(channel.calls_for(envelope.key)) == 1
    assert (result.attempts, result.provider_reached) == (1, True)


def test_a_stale_snapshot_holds_the_call_until_a_fresh_one_arrives(fake_clock, make_envelope):
    """Nothing published since 0 s: the call waits; the first fresh snapshot at 7 s lets it go."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    gate = Gate(max_age=1.0, clock=fake_clock)
    gate.publish({}, taken_at=-5.0)  # read long ago

    async def late_publisher():
        await fake_clock.sleep(7)
        gate.publish({}, taken_at=fake_clock.monotonic())

    [result] = _deliver_with(gate, late_publisher, [envelope], channel, fake_clock, policy=POLICY)

    assert result.outcome is Outcome.SENT
    assert channel.start_times == [pytest.approx(7.0, abs=0.05)]


def test_with_no_fresh_snapshot_before_the_deadline_nothing_is_called(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=30))
    gate = Gate(max_age=1.0, clock=fake_clock)

    async def silent():
        await asyncio.Event().wait()

    [result] = _deliver_with(gate, silent, [envelope], channel, fake_clock, policy=POLICY)

    assert result.outcome is Outcome.EXPIRED
    assert channel.calls == []
    assert fake_clock.monotonic() == pytest.approx(30.0, abs=0.05)


def test_a_call_never_runs_past_the_deadline(fake_clock, make_envelope):
    """Item 5: a call that starts 4 s before the deadline is cut at the deadline, not after
    its 10 s call timeout; a call can no longer run 15 s past it."""
    channel = MemoryChannel(clock=fake_clock, delay=60.0)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=4))

    [result] = run(deliver([envelope], channel, policy=POLICY, clock=fake_clock))

    assert result.outcome is Outcome.TIMED_OUT
    assert result.error.startswith("provider call cut off at the deadline, after 4s")
    [call] = channel.calls_for(envelope.key)
    assert call.ended_at == pytest.approx(4.0)


@pytest.mark.parametrize("keys", [False, True], ids=["without_keys", "with_keys"])
@pytest.mark.parametrize("left", [1.9, 0.5, 0.001])
def test_a_call_that_could_not_be_repeated_is_not_started_just_before_the_deadline(
    fake_clock, make_envelope, left, keys
):
    """Under min_call_window (2 s) before the deadline, with idempotency keys or without
    (after the deadline no call is repeated, keyed or not): no call, and the reminder ends
    known-not-sent (expired), never cut off at the deadline with its outcome open."""
    channel = MemoryChannel(clock=fake_clock, delay=0.2, honours_idempotency_keys=keys)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=left))

    [result] = run(deliver([envelope], channel, policy=POLICY, clock=fake_clock))

    assert (result.outcome, result.attempts, result.maybe_delivered) == (
        Outcome.EXPIRED, 0, False,
    )  # fmt: skip
    assert result.error == (
        f"not started with {left:.3g}s left before the deadline "
        f"{envelope.deadline_at.isoformat()}: under min_call_window=2s: a call cut off at "
        "the deadline could not be repeated"
    )
    assert channel.calls_for(envelope.key) == []


def test_the_call_window_leaves_calls_with_time_alone(fake_clock, make_envelope):
    """A call starts at exactly min_call_window before the deadline, with keys or without;
    with the window at 0 the last half second is used."""
    keyed = MemoryChannel(clock=fake_clock, delay=0.2, honours_idempotency_keys=True)
    close = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=2))
    [sent] = run(deliver([close], keyed, policy=POLICY, clock=fake_clock))
    assert sent.outcome is Outcome.SENT

    plain = MemoryChannel(clock=fake_clock, delay=0.2, honours_idempotency_keys=False)
    edge = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=2))
    [result] = run(deliver([edge], plain, policy=POLICY, clock=fake_clock))
    assert result.outcome is Outcome.SENT
    unlimited = DeliveryLimits(**{**_fields(POLICY), "min_call_window": 0})
    late = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=0.5))
    [anyway] = run(deliver([late], plain, policy=unlimited, clock=fake_clock))
    assert anyway.outcome is Outcome.SENT


def _fields(policy: DeliveryLimits) -> dict:
    return {name: getattr(policy, name) for name in policy.__slots__}


@pytest.mark.parametrize("through", ["stop", "flag"])
def test_a_stop_lets_calls_in_flight_finish_within_the_drain_and_starts_nothing_new(
    fake_clock, make_envelope, through
):
    """Item 12: a warm shutdown at 1 s. The two calls in flight (3 s each) finish inside
    the 5 s drain; the three waiting for a slot never start. Through ``flag``, the caller's
    own flag (a worker's shutdown flag, set by another process) with nothing passing it on
    to the loop: the next starts look at it themselves, and the batch ends at 3 s, not at
    its budget."""
    channel = MemoryChannel(clock=fake_clock, delay=3.0)
    envelopes = [make_envelope() for _ in range(5)]
    stop, flag = asyncio.Event(), threading.Event()
    policy = DeliveryLimits(concurrency=2, call_timeout=10, drain=5)

    async def scenario():
        async def stopper():
            await fake_clock.sleep(1)
            (stop if through == "stop" else flag).set()

        async with asyncio.TaskGroup() as group:
            group.create_task(stopper())
            return await deliver(
                envelopes, channel, policy=policy, clock=fake_clock, stop=stop, flags=[flag]
            )

    results = run(scenario())

    assert [r.outcome for r in results] == [Outcome.SENT] * 2 + [Outcome.CANCELLED] * 3
    assert [r.attempts for r in results[2:]] == [0, 0, 0]
    assert len(channel.calls) == 2
    assert fake_clock.monotonic() == pytest.approx(3.0)


def test_a_hedge_staggered_past_a_withdrawal_is_not_sent(fake_clock, make_envelope):
    """S5 with hedging: the first endpoint is slow, the second is due 2 s after the call was
    cleared, and the workshop is cancelled at 0.5 s. The second endpoint gets nothing."""
    from delivery.hedge import hedged_send

    slow = MemoryChannel(clock=fake_clock, name="a", delay=5.0)
    spare = MemoryChannel(clock=fake_clock, name="b", delay=0.1)

    class Hedged:
        name = "hedged"
        honours_idempotency_keys = True
        max_concurrency = None

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return None

        async def send(self, envelope):
            return await hedged_send(envelope, [slow, spare], clock=fake_clock, stagger=2.0)

    envelope = make_envelope()
    gate = Gate(max_age=1.0, clock=fake_clock)
    publisher = _publisher(gate, fake_clock, {0.5: {envelope.reminder_id: "workshop cancelled"}})

    [result] = _deliver_with(gate, publisher, [envelope], Hedged(), fake_clock, policy=POLICY)

    assert [len(slow.calls), len(spare.calls)] == [1, 0]
    assert slow.start_times == [0.0]
    assert result.outcome is Outcome.SENT  # the call already under way was not withdrawn
