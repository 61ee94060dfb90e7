"""Edge cases found by mutation testing (make mutate): each test pins a boundary or a
branch that the behaviour tests reach but did not tell apart."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import pytest

from delivery import DeliveryLimits, Outcome, RateLimitedError, TransientError, deliver
from delivery.gate import Gate
from delivery.limiter import DeadlineReached, LocalRateLimiter, RedisRateLimiter
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)


class _StillClock:
    """A monotonic clock that never moves and refuses to sleep."""

    def __init__(self, at: float) -> None:
        self.at = at

    def monotonic(self) -> float:
        return self.at

    async def sleep(self, seconds: float) -> None:
        raise AssertionError(f"slept {seconds}s although the snapshot was fresh")


# -- gate ------------------------------------------------------------------------


@pytest.mark.parametrize("max_age", [0, 0.0, -1])
def test_gate_refuses_a_max_age_that_is_not_positive(max_age):
    with pytest.raises(ValueError, match="Gate.max_age must be a positive number of seconds"):
        Gate(max_age=max_age, clock=_StillClock(0.0))


def test_a_snapshot_exactly_max_age_old_still_clears_a_call():
    clock = _StillClock(100.0)
    gate = Gate(max_age=5.0, clock=clock)
    gate.publish({7: "cancelled"}, taken_at=95.0)
    assert asyncio.run(gate.clearance(7)) == "cancelled"
    assert asyncio.run(gate.clearance(8)) is None


def test_freshness_ends_just_past_max_age_and_needs_a_snapshot():
    clock = _StillClock(100.0)
    gate = Gate(max_age=5.0, clock=clock)
    assert gate._fresh() is None
    gate.publish({}, taken_at=94.5)
    assert gate._fresh() is None
    gate.publish({}, taken_at=95.5)
    assert gate._fresh() == {}


def test_an_older_snapshot_never_replaces_a_newer_one():
    gate = Gate(max_age=5.0, clock=_StillClock(100.0))
    gate.publish({1: "workshop cancelled"}, taken_at=99.0)
    gate.publish({}, taken_at=98.0)
    assert gate.withdrawn(1) == "workshop cancelled"


def test_a_snapshot_read_at_the_same_instant_replaces_the_last_one():
    gate = Gate(max_age=5.0, clock=_StillClock(100.0))
    gate.publish({1: "workshop cancelled"}, taken_at=99.0)
    gate.publish({2: "enrollment cancelled"}, taken_at=99.0)
    assert gate.withdrawn(1) is None
    assert gate.withdrawn(2) == "enrollment cancelled"


def test_withdrawn_reads_the_latest_snapshot_fresh_or_not():
    gate = Gate(max_age=5.0, clock=_StillClock(100.0))
    assert gate.withdrawn(1) is None
    gate.publish({1: "moved"}, taken_at=10.0)  # long stale
    assert gate.withdrawn(1) == "moved"
    assert gate.withdrawn(2) is None


# -- limiters --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"window": 0}, "window must be a positive number of seconds"),
        ({"window": math.inf}, "window must be a positive number of seconds"),
        ({"window": "1"}, "window must be a positive number of seconds"),
        ({"margin": -0.5}, r"margin must be a number of seconds >= 0"),
        ({"margin": math.nan}, r"margin must be a number of seconds >= 0"),
        ({"margin": math.inf}, r"margin must be a number of seconds >= 0"),
        ({"margin": "0"}, r"margin must be a number of seconds >= 0"),
    ],
)
def test_both_limiters_refuse_a_bad_window_or_margin(fake_clock, fields, message):
    with pytest.raises(ValueError, match=message):
        LocalRateLimiter(5, clock=fake_clock, **fields)
    with pytest.raises(ValueError, match=message):
        RedisRateLimiter(url="redis://x", account="a", per_second=5, clock=fake_clock, **fields)


def test_the_per_second_message_says_what_it_counts(fake_clock):
    with pytest.raises(ValueError, match=r"it counts call starts per window\.$"):
        LocalRateLimiter(0, clock=fake_clock)


def test_a_zero_margin_is_allowed_and_the_settings_are_readable(fake_clock):
    local = LocalRateLimiter(5, clock=fake_clock, window=2.0, margin=0)
    assert (local.per_second, local.window) == (5, 2.0)
    remote = RedisRateLimiter(url="redis://x", account="acct", per_second=4, clock=fake_clock)
    assert (remote.per_second, remote.window, remote.account) == (4, 1.0, "acct")
    assert remote.starts_key == "delivery:ratelimit:{acct}:starts"
    assert remote.pause_key == "delivery:ratelimit:{acct}:pause"
    assert remote._span_us == 1_020_000
    assert remote._interval_us == 255_000
    flat = RedisRateLimiter(
        url="redis://x", account="acct", per_second=3, clock=fake_clock, spread=False
    )
    assert flat._interval_us == 0


def test_the_redis_limiter_says_which_setting_is_missing(fake_clock):
    with pytest.raises(ValueError, match=r"^RedisRateLimiter needs url, e\.g\. redis://"):
        RedisRateLimiter(url="", account="a", per_second=1, clock=fake_clock)
    with pytest.raises(ValueError, match=r"^RedisRateLimiter needs account: the provider"):
        RedisRateLimiter(url="redis://x", account="", per_second=1, clock=fake_clock)


def test_a_deadline_that_is_now_gets_no_start(fake_clock):
    async def main():
        local = LocalRateLimiter(5, clock=fake_clock)
        remote = RedisRateLimiter(url="redis://x", account="a", per_second=5, clock=fake_clock)
        for limiter in (local, remote):
            with pytest.raises(DeadlineReached, match="^the deadline passed before a start was"):
                await limiter.acquire(deadline_at=fake_clock.now())
        await remote.aclose()

    asyncio.run(main())


def test_a_next_start_exactly_at_the_deadline_is_refused(fake_clock):
    async def main():
        limiter = LocalRateLimiter(1, clock=fake_clock, window=1.0, margin=0.0)
        await limiter.acquire()
        with pytest.raises(DeadlineReached, match="at or after the deadline"):
            await limiter.acquire(deadline_at=fake_clock.now() + timedelta(seconds=1))

    asyncio.run(main())


def test_a_short_pause_holds_the_next_start_and_a_zero_pause_does_not(fake_clock):
    async def main():
        limiter = LocalRateLimiter(100, clock=fake_clock, spread=False)
        await limiter.pause(0)
        await limiter.pause(-1)
        started = fake_clock.monotonic()
        await limiter.acquire()
        assert fake_clock.monotonic() == started
        await limiter.pause(0.5)
        await limiter.acquire()
        assert fake_clock.monotonic() == pytest.approx(started + 0.5)

    asyncio.run(main())


def test_spread_starts_keep_their_schedule_when_a_start_is_on_time(fake_clock):
    async def main():
        limiter = LocalRateLimiter(2, clock=fake_clock, window=1.0, margin=0.0)
        begin = fake_clock.monotonic()
        await limiter.acquire()
        await limiter.acquire()
        assert fake_clock.monotonic() == pytest.approx(begin + 0.5)
        fake_clock.advance(0.5)  # exactly one interval later: still on schedule
        await limiter.acquire()
        assert fake_clock.monotonic() == pytest.approx(begin + 1.0)
        await limiter.acquire()
        assert fake_clock.monotonic() == pytest.approx(begin + 1.5)

    asyncio.run(main())


# -- engine ----------------------------------------------------------------------


def _deliver_stopped_at(seconds: float, envelopes, channel, *, clock, **options):
    """Deliver ``envelopes``, setting the stop signal ``seconds`` in on the fake clock."""

    async def main():
        stop = asyncio.Event()

        async def stop_later():
            await clock.sleep(seconds)
            stop.set()

        stopper = asyncio.create_task(stop_later())
        results = await deliver(envelopes, channel, clock=clock, stop=stop, **options)
        await stopper
        return results

    return asyncio.run(main())


class _RecordingLimiter:
    window = 1.0

    def __init__(self, fail: Exception | None = None, *, script: list | None = None) -> None:
        self.deadlines: list = []
        self.pauses: list[float] = []
        self.fail = fail
        self.script = list(script or [])  # one entry per acquire: None or an exception

    async def acquire(self, *, deadline_at=None) -> None:
        self.deadlines.append(deadline_at)
        error = self.script.pop(0) if self.script else self.fail
        if error is not None:
            raise error

    async def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)

    async def aclose(self) -> None:
        return None


def test_the_engine_asks_the_limiter_with_the_deadline_and_pauses_only_on_429(
    fake_clock, make_envelope
):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("busy"))
    limiter = _RecordingLimiter()
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=2, backoff_base=1, jitter=0)
    (result,) = asyncio.run(
        deliver([envelope], channel, policy=policy, clock=fake_clock, limiter=limiter)
    )
    assert result.outcome is Outcome.SENT
    assert result.message_id == channel.accepted[envelope.key]
    assert result.message_id
    assert (result.provider_reached, result.maybe_delivered) == (True, True)
    assert limiter.deadlines == [envelope.deadline_at, envelope.deadline_at]
    assert limiter.pauses == []


def test_a_broken_limiter_is_a_transient_failure_that_never_calls(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    limiter = _RecordingLimiter(fail=RuntimeError("redis down"))
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1)
    (result,) = asyncio.run(
        deliver([envelope], channel, policy=policy, clock=fake_clock, limiter=limiter)
    )
    assert result.outcome is Outcome.TRANSIENT
    assert result.error.endswith("rate limiter unavailable: RuntimeError('redis down')")
    assert (result.attempts, result.provider_reached) == (0, False)
    assert channel.calls == []


def test_a_withdrawn_envelope_spends_no_limiter_grant(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    kept, dropped = make_envelope(), make_envelope()
    gate = Gate(max_age=5.0, clock=fake_clock)
    gate.publish({dropped.reminder_id: "workshop moved"}, taken_at=fake_clock.monotonic())
    limiter = _RecordingLimiter()
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1)
    results = asyncio.run(
        deliver(
            [kept, dropped], channel, policy=policy, clock=fake_clock, limiter=limiter, gate=gate
        )
    )
    assert [r.outcome for r in results] == [Outcome.SENT, Outcome.WITHDRAWN]
    assert results[1].error == "withdrawn before the call: workshop moved"
    assert limiter.deadlines == [kept.deadline_at]


def test_a_deadline_met_in_the_limiter_after_a_failed_call_keeps_its_outcome(
    fake_clock, make_envelope
):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("busy"))
    limiter = _RecordingLimiter(script=[None, DeadlineReached("late")])
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=3, backoff_base=1, jitter=0)
    (result,) = asyncio.run(
        deliver([envelope], channel, policy=policy, clock=fake_clock, limiter=limiter)
    )
    assert result.outcome is Outcome.TRANSIENT
    assert result.error == "deadline reached after 1 attempts; last error: busy"


def test_a_deadline_met_before_any_call_quotes_the_last_error(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    limiter = _RecordingLimiter(script=[RuntimeError("down"), DeadlineReached("late")])
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=3, backoff_base=1, jitter=0)
    (result,) = asyncio.run(
        deliver([envelope], channel, policy=policy, clock=fake_clock, limiter=limiter)
    )
    assert result.outcome is Outcome.EXPIRED
    assert result.error == (
        f"deadline {envelope.deadline_at.isoformat()} reached before the call could start; "
        "last error: rate limiter unavailable: RuntimeError('down')"
    )


def test_the_drain_lets_calls_that_end_in_time_finish_and_cuts_the_rest(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    quick, slow = make_envelope(), make_envelope()
    channel.slow(quick.key, 0.8)
    channel.slow(slow.key, 1.2)
    policy = DeliveryLimits(concurrency=2, call_timeout=5, max_attempts=1, budget=0.5, drain=0.5)
    results = asyncio.run(deliver([quick, slow], channel, policy=policy, clock=fake_clock))
    assert [r.outcome for r in results] == [Outcome.SENT, Outcome.CANCELLED]
    assert fake_clock.monotonic() == pytest.approx(1.0)


def test_a_stop_during_the_budget_drain_ends_the_batch_at_once(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.slow(envelope.key, 100.0)
    policy = DeliveryLimits(concurrency=1, call_timeout=200, max_attempts=1, budget=1.0, drain=10)

    (result,) = _deliver_stopped_at(2.0, [envelope], channel, policy=policy, clock=fake_clock)
    assert result.outcome is Outcome.CANCELLED
    assert fake_clock.monotonic() == pytest.approx(2.0)


def test_spread_starts_follow_the_schedule_not_a_late_start(fake_clock):
    async def main():
        limiter = LocalRateLimiter(2, clock=fake_clock, window=1.0, margin=0.0)
        begin = fake_clock.monotonic()
        await limiter.acquire()  # next start due at 0.5
        fake_clock.advance(0.7)
        await limiter.acquire()  # late but on schedule: next due at 1.0, not 1.2
        await limiter.acquire()
        assert fake_clock.monotonic() == pytest.approx(begin + 1.0)

    asyncio.run(main())


def test_a_call_with_less_than_a_second_left_still_starts_clamped(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    quick = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=0.8))
    slow = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=0.5))
    channel.slow(quick.key, 0.1)
    channel.slow(slow.key, 10.0)
    # No call window, so the last second is used and the clamp is what stops the slow call.
    policy = DeliveryLimits(concurrency=2, call_timeout=5, max_attempts=1, min_call_window=0)
    results = asyncio.run(deliver([quick, slow], channel, policy=policy, clock=fake_clock))
    assert results[0].outcome is Outcome.SENT
    assert results[1].outcome is Outcome.TIMED_OUT
    assert "provider call cut off at the deadline, after 0.5s" in results[1].error


def test_a_backing_off_envelope_waits_for_a_slot_again(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    first, second, third = make_envelope(), make_envelope(), make_envelope()
    channel.fail(first.key, TransientError("busy"))
    channel.slow(second.key, 5.0)
    channel.slow(third.key, 5.0)
    policy = DeliveryLimits(
        concurrency=1, call_timeout=10, max_attempts=2, backoff_base=1, jitter=0
    )
    results = asyncio.run(deliver([first, second, third], channel, policy=policy, clock=fake_clock))
    assert [r.outcome for r in results] == [Outcome.SENT] * 3
    assert channel.peak_in_flight == 1


def test_a_stop_before_any_call_says_so(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1)

    async def main():
        stop = asyncio.Event()
        stop.set()
        return await deliver([envelope], channel, policy=policy, clock=fake_clock, stop=stop)

    (result,) = asyncio.run(main())
    assert result.outcome is Outcome.CANCELLED
    assert result.error == "stopped (stop signal) before the first attempt"


def test_the_drain_ends_when_the_last_call_ends(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.slow(envelope.key, 0.8)
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1, budget=0.5, drain=10)
    (result,) = asyncio.run(deliver([envelope], channel, policy=policy, clock=fake_clock))
    assert result.outcome is Outcome.SENT
    assert fake_clock.monotonic() == pytest.approx(0.8)


def test_no_call_in_flight_at_the_budget_means_no_drain_wait(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("busy"))
    policy = DeliveryLimits(
        concurrency=1,
        call_timeout=5,
        max_attempts=3,
        backoff_base=5,
        jitter=0,
        budget=0.5,
        drain=10,
    )
    (result,) = asyncio.run(deliver([envelope], channel, policy=policy, clock=fake_clock))
    assert result.outcome is Outcome.CANCELLED
    assert fake_clock.monotonic() == pytest.approx(0.5)


def test_the_budget_counts_from_the_start_of_the_batch(fake_clock, make_envelope):
    fake_clock.advance(100)
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.slow(envelope.key, 1.0)
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1, budget=5)
    (result,) = asyncio.run(deliver([envelope], channel, policy=policy, clock=fake_clock))
    assert result.outcome is Outcome.SENT


class _SlowLimiter(_RecordingLimiter):
    """Grants at once, except for the reminders in ``waits`` (seconds on the clock)."""

    def __init__(self, clock, waits: dict[int, float], jump: dict[int, float] | None = None):
        super().__init__()
        self.clock = clock
        self.waits = waits
        self.jump = jump or {}
        self.by_deadline: dict = {}

    async def acquire(self, *, deadline_at=None) -> None:
        reminder_id = self.by_deadline[deadline_at]
        if reminder_id in self.jump:
            self.clock.advance(self.jump[reminder_id])
        if reminder_id in self.waits:
            await self.clock.sleep(self.waits[reminder_id])


def test_a_call_granted_after_the_budget_ran_out_is_cancelled_not_started(
    fake_clock, make_envelope
):
    channel = MemoryChannel(clock=fake_clock)
    running = make_envelope()
    waiting = make_envelope(deadline_at=fake_clock.now() + timedelta(hours=2))
    channel.slow(running.key, 3.0)
    limiter = _SlowLimiter(fake_clock, waits={waiting.reminder_id: 2.0})
    limiter.by_deadline = {running.deadline_at: running.reminder_id}
    limiter.by_deadline[waiting.deadline_at] = waiting.reminder_id
    policy = DeliveryLimits(concurrency=2, call_timeout=5, max_attempts=1, budget=1, drain=5)
    results = asyncio.run(
        deliver([running, waiting], channel, policy=policy, clock=fake_clock, limiter=limiter)
    )
    assert [r.outcome for r in results] == [Outcome.SENT, Outcome.CANCELLED]
    assert results[1].error == "stopped (budget of 1s used up) before the first attempt"


def test_a_grant_that_comes_at_the_deadline_starts_no_call(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=30))
    limiter = _SlowLimiter(fake_clock, waits={}, jump={envelope.reminder_id: 30.0})
    limiter.by_deadline = {envelope.deadline_at: envelope.reminder_id}
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1, budget=600)
    (result,) = asyncio.run(
        deliver([envelope], channel, policy=policy, clock=fake_clock, limiter=limiter)
    )
    assert result.outcome is Outcome.EXPIRED
    assert channel.calls == []


class _SlowPauseLimiter(_RecordingLimiter):
    """A shared limiter whose pause is a slow round trip (Redis under load)."""

    def __init__(self, clock, pause_takes: float) -> None:
        super().__init__()
        self._clock = clock
        self._pause_takes = pause_takes

    async def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        await self._clock.sleep(self._pause_takes)


def test_a_stop_during_the_limiter_pause_after_a_429_quotes_the_429(fake_clock, make_envelope):
    """The failure is stored before the pause, so the stop's text names the 429."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, RateLimitedError("429 too many requests", retry_after=30))
    limiter = _SlowPauseLimiter(fake_clock, pause_takes=10.0)
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=3, backoff_base=1)

    (result,) = _deliver_stopped_at(
        1.0, [envelope], channel, policy=policy, clock=fake_clock, limiter=limiter
    )
    assert limiter.pauses == [30]
    assert result.outcome is Outcome.CANCELLED
    assert result.error == (
        "stopped (stop signal) after 1 attempts; last error: 429 too many requests"
    )
    assert fake_clock.monotonic() == pytest.approx(1.0)


class _SlowOpenChannel(MemoryChannel):
    async def __aenter__(self):
        await self._clock.sleep(3.0)
        return await super().__aenter__()


def test_the_budget_counts_from_the_batch_start_including_a_slow_channel_open(
    fake_clock, make_envelope
):
    """Opening took 3 s of a 5 s budget: the stop comes 2 s into the sends, not 5."""
    channel = _SlowOpenChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.slow(envelope.key, 100.0)
    policy = DeliveryLimits(concurrency=1, call_timeout=200, max_attempts=1, budget=5.0, drain=0.5)
    (result,) = asyncio.run(deliver([envelope], channel, policy=policy, clock=fake_clock))
    assert result.outcome is Outcome.CANCELLED
    assert result.error == "stopped (budget of 5s used up) while call 1 was in flight"
    assert fake_clock.monotonic() == pytest.approx(5.5)  # budget, then the drain


def test_a_retry_that_would_start_exactly_at_the_deadline_is_not_waited_for(
    fake_clock, make_envelope
):
    """The backoff (2 s) ends exactly at the deadline: give up now, do not sleep into it."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=2))
    channel.fail(envelope.key, TransientError("busy"))
    policy = DeliveryLimits(concurrency=1, call_timeout=1, max_attempts=3, backoff_base=2, jitter=0)
    (result,) = asyncio.run(deliver([envelope], channel, policy=policy, clock=fake_clock))
    assert result.outcome is Outcome.TRANSIENT
    assert result.error == (
        "busy; not retried: the next try (in 2s) would start at or after the deadline"
    )
    assert fake_clock.monotonic() == 0.0


def test_a_start_a_whole_interval_late_restarts_the_schedule(fake_clock):
    """Late by exactly one interval: the next start is one interval after this one,
    never at the same instant."""

    async def main():
        limiter = LocalRateLimiter(2, clock=fake_clock, window=1.0, margin=0.0)
        await limiter.acquire()  # at 0; next due at 0.5
        await limiter.acquire()  # at 0.5; next due at 1.0
        fake_clock.advance(1.0)  # 1.5: one whole interval past the schedule
        await limiter.acquire()
        assert fake_clock.monotonic() == 1.5
        await limiter.acquire()
        assert fake_clock.monotonic() == 2.0

    asyncio.run(main())


def test_a_clearance_that_arrives_after_the_budget_ran_out_starts_no_call(
    fake_clock, make_envelope
):
    """An envelope back from backoff waits for a fresh snapshot; the budget runs out
    while another call drains; the snapshot then arrives, and no call starts."""
    channel = MemoryChannel(clock=fake_clock)
    draining, waiting = make_envelope(), make_envelope()
    channel.slow(draining.key, 5.0)
    channel.fail(waiting.key, TransientError("busy"))
    gate = Gate(max_age=0.5, clock=fake_clock)
    gate.publish({}, taken_at=fake_clock.monotonic())
    policy = DeliveryLimits(
        concurrency=2,
        call_timeout=10,
        max_attempts=3,
        backoff_base=1,
        jitter=0,
        budget=2.0,
        drain=10,
    )

    async def main():
        async def fresh_snapshot_later():
            await fake_clock.sleep(3.0)  # inside the drain: the budget ended at 2 s
            gate.publish({}, taken_at=fake_clock.monotonic())

        publisher = asyncio.create_task(fresh_snapshot_later())
        results = await deliver(
            [draining, waiting], channel, policy=policy, clock=fake_clock, gate=gate
        )
        await publisher
        return results

    sent, stopped = asyncio.run(main())
    assert sent.outcome is Outcome.SENT
    assert stopped.outcome is Outcome.CANCELLED
    assert stopped.error == "stopped (budget of 2s used up) after 1 attempts; last error: busy"
    assert [call.key for call in channel.calls].count(waiting.key) == 1


class _BrokenGate(Gate):
    """A gate with a bug for one reminder: the engine's own safety net must hold."""

    def __init__(self, broken_id: int, clock) -> None:
        super().__init__(max_age=5.0, clock=clock)
        self._broken_id = broken_id
        self.publish({}, taken_at=clock.monotonic())

    async def clearance(self, reminder_id: int) -> str | None:
        if reminder_id == self._broken_id:
            raise RuntimeError("gate bug")
        return await super().clearance(reminder_id)


def test_a_bug_below_the_engine_fails_one_envelope_logs_it_and_the_batch_goes_on(
    fake_clock, make_envelope, caplog
):
    channel = MemoryChannel(clock=fake_clock)
    broken, fine = make_envelope(), make_envelope()
    policy = DeliveryLimits(concurrency=2, call_timeout=5, max_attempts=1)
    gate = _BrokenGate(broken.reminder_id, fake_clock)
    with caplog.at_level("ERROR", logger="delivery"):
        failed, sent = asyncio.run(
            deliver([broken, fine], channel, policy=policy, clock=fake_clock, gate=gate)
        )
    assert failed.outcome is Outcome.PERMANENT
    assert failed.error == "internal error in the delivery engine: RuntimeError('gate bug')"
    assert sent.outcome is Outcome.SENT
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == f"Delivery engine failed on reminder {broken.reminder_id}"
    assert record.exc_info is not None


def test_a_broken_limiter_is_logged_with_the_reminder_and_the_error(
    fake_clock, make_envelope, caplog
):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    limiter = _RecordingLimiter(fail=RuntimeError("redis down"))
    policy = DeliveryLimits(concurrency=1, call_timeout=5, max_attempts=1)
    with caplog.at_level("WARNING", logger="delivery"):
        asyncio.run(deliver([envelope], channel, policy=policy, clock=fake_clock, limiter=limiter))
    assert (
        f"Rate limiter failed for reminder {envelope.reminder_id}: RuntimeError('redis down')"
        in [r.getMessage() for r in caplog.records]
    )
