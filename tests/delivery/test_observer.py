"""What the engine tells its observer: one report per provider call, per send, per limiter wait.

On a FakeClock, so every duration the observer hears is exact.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from delivery import (
    DeliveryLimits,
    Outcome,
    OutcomeUnknownError,
    PermanentError,
    RateLimitedError,
    TransientError,
    deliver,
)
from delivery.limiter import LocalRateLimiter
from delivery.observer import Observer
from tests.delivery.conftest import run
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.sends: list[tuple[str, float]] = []
        self.waits: list[float] = []

    def call_ended(self, channel: str, outcome: str, seconds: float, kind: str) -> None:
        self.calls.append((channel, outcome, seconds))

    def sent(self, channel: str, slack_seconds: float, kind: str) -> None:
        self.sends.append((channel, slack_seconds))

    def limiter_waited(self, seconds: float) -> None:
        self.waits.append(seconds)


def test_the_recorder_is_an_observer():
    assert isinstance(Recorder(), Observer)


def test_each_call_is_reported_with_how_it_ended_and_how_long_it_took(fake_clock, make_envelope):
    """Six envelopes, each ending one way: one report per call, with the call's own time."""
    channel = MemoryChannel(clock=fake_clock, delay=0.25)
    envelopes = [make_envelope() for _ in range(6)]
    channel.fail(envelopes[1].key, TransientError("HTTP 503"))
    channel.fail(envelopes[2].key, PermanentError("HTTP 400"))
    channel.fail(envelopes[3].key, RateLimitedError("HTTP 429", retry_after=0.5))
    channel.fail(envelopes[4].key, OutcomeUnknownError("connection lost after sending"))
    channel.slow(envelopes[5].key, 100.0, 100.0)
    policy = DeliveryLimits(concurrency=6, call_timeout=2.0, max_attempts=2, backoff_base=1)
    recorder = Recorder()

    results = run(deliver(envelopes, channel, policy=policy, clock=fake_clock, observer=recorder))

    assert [r.outcome for r in results] == [
        Outcome.SENT, Outcome.SENT, Outcome.PERMANENT, Outcome.SENT, Outcome.SENT,
        Outcome.TIMED_OUT,
    ]  # fmt: skip
    outcomes = sorted(outcome for _, outcome, _ in recorder.calls)
    assert outcomes == sorted(
        ["sent"] * 4 + ["transient", "permanent", "throttled", "maybe_delivered"] + ["timeout"] * 2
    )
    assert {channel for channel, _, _ in recorder.calls} == {"memory"}
    # A failure raised by the channel comes back at once; an answered call takes its delay;
    # a timed-out one takes the call timeout.
    by_outcome = {}
    for _, outcome, seconds in recorder.calls:
        by_outcome.setdefault(outcome, set()).add(round(seconds, 9))
    assert by_outcome["sent"] == {0.25}
    assert by_outcome["timeout"] == {2.0}
    assert len(recorder.sends) == 4


def test_a_send_reports_its_slack_before_the_deadline(fake_clock, make_envelope):
    """An envelope due in an hour, answered after 0.25 s, went out 3599.75 s before its deadline."""
    channel = MemoryChannel(clock=fake_clock, delay=0.25)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(hours=1))
    recorder = Recorder()

    run(deliver([envelope], channel, policy=DeliveryLimits(), clock=fake_clock, observer=recorder))

    assert recorder.sends == [("memory", pytest.approx(3599.75))]


def test_each_wait_for_the_limiter_is_reported(fake_clock, make_envelope):
    """Three starts at one per second: the waits are 0, then about 1 and 2 windows."""
    channel = MemoryChannel(clock=fake_clock)
    limiter = LocalRateLimiter(1, clock=fake_clock, margin=0.0)
    recorder = Recorder()

    run(
        deliver(
            [make_envelope() for _ in range(3)],
            channel,
            policy=DeliveryLimits(concurrency=3),
            clock=fake_clock,
            limiter=limiter,
            observer=recorder,
        )
    )

    assert sorted(recorder.waits) == pytest.approx([0.0, 1.0, 2.0])


def test_a_call_cut_off_by_a_stop_is_reported_as_maybe_delivered(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.hang(envelope.key)
    recorder = Recorder()
    stop = asyncio.Event()

    async def scenario():
        batch = asyncio.create_task(
            deliver(
                [envelope],
                channel,
                policy=DeliveryLimits(drain=0),
                clock=fake_clock,
                stop=stop,
                observer=recorder,
            )
        )
        await fake_clock.sleep(3)
        stop.set()
        return await batch

    [result] = run(scenario())

    assert result.outcome is Outcome.CANCELLED
    assert recorder.calls == [("memory", "maybe_delivered", 3.0)]
    assert recorder.sends == []


class _Broken(Recorder):
    def call_ended(self, channel, outcome, seconds, kind):
        raise OSError("No space left on device")


def test_an_observer_that_fails_changes_no_outcome_and_is_logged_once(
    fake_clock, make_envelope, caplog
):
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(5)]

    results = run(
        deliver(envelopes, channel, policy=DeliveryLimits(), clock=fake_clock, observer=_Broken())
    )

    assert [r.outcome for r in results] == [Outcome.SENT] * 5
    assert len(channel.accepted) == 5
    failures = [r for r in caplog.records if "observer failed" in r.getMessage()]
    assert len(failures) == 1
