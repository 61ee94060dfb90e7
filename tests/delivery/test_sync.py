"""A Session run for one batch from synchronous code: the crossing the Celery task uses."""

from __future__ import annotations

import asyncio
import threading

import pytest

from delivery import DeliveryLimits, Outcome
from delivery.limiter import LocalRateLimiter
from tests.delivery.conftest import deliver_once, run, tasks_left
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)


def test_a_session_runs_a_batch_on_an_event_loop_of_its_own(system_clock, make_real_envelope):
    """The channel is built inside the batch's loop and closed before the call returns."""
    built: list[MemoryChannel] = []

    def channel_factory():
        asyncio.get_running_loop()  # raises unless called inside the loop
        built.append(MemoryChannel(clock=system_clock))
        return built[-1]

    results = deliver_once(
        [make_real_envelope() for _ in range(3)],
        channel_factory,
        policy=DeliveryLimits(),
        clock=system_clock,
    )

    assert [r.outcome for r in results] == [Outcome.SENT] * 3
    assert (built[0].opened, built[0].closed) == (1, 1)


def test_a_session_refuses_to_open_inside_a_running_event_loop(system_clock, make_real_envelope):
    async def inside_a_loop():
        deliver_once(
            [make_real_envelope()],
            lambda: MemoryChannel(clock=system_clock),
            policy=DeliveryLimits(),
            clock=system_clock,
        )

    with pytest.raises(RuntimeError, match=r"await delivery\.deliver\(\) there instead"):
        run(inside_a_loop())


def test_a_threading_stop_event_set_elsewhere_cancels_the_batch(system_clock, make_real_envelope):
    """A warm shutdown in another thread stops a hanging call."""
    channels: list[MemoryChannel] = []
    envelopes = [make_real_envelope() for _ in range(3)]

    def channel_factory():
        channel = MemoryChannel(clock=system_clock)
        channel.hang(envelopes[1].key)
        channels.append(channel)
        return channel

    stop = threading.Event()

    def stop_once_the_calls_began() -> None:
        """A loaded host may start the calls late: stop only when all three began."""
        until = system_clock.monotonic() + 10
        while not (channels and len(channels[0].calls) == 3) and system_clock.monotonic() < until:
            system_clock.sleep_blocking(0.01)
        system_clock.sleep_blocking(0.1)
        stop.set()

    timer = threading.Thread(target=stop_once_the_calls_began)
    timer.start()
    began = system_clock.monotonic()
    try:
        results = deliver_once(
            envelopes,
            channel_factory,
            policy=DeliveryLimits(concurrency=3, call_timeout=30),
            clock=system_clock,
            stop=stop,
        )
    finally:
        timer.join()
    elapsed = system_clock.monotonic() - began

    assert [r.outcome for r in results] == [Outcome.SENT, Outcome.CANCELLED, Outcome.SENT]
    assert results[1].error == "stopped (stop signal) while call 1 was in flight"
    assert channels[0].calls_for(envelopes[1].key)[0].outcome == "cancelled"
    # Ended by the stop 0.1 s after the calls began, not by the 30 s call timeout (half of
    # it is a bound no loaded runner comes near).
    assert 0.1 <= elapsed < 30 / 2


def test_a_session_builds_and_closes_the_limiter_inside_its_loop(system_clock, make_real_envelope):
    closed: list[bool] = []

    class TrackedLimiter(LocalRateLimiter):
        async def aclose(self):
            closed.append(True)

    results = deliver_once(
        [make_real_envelope()],
        lambda: MemoryChannel(clock=system_clock),
        policy=DeliveryLimits(),
        clock=system_clock,
        limiter_factory=lambda: TrackedLimiter(5, clock=system_clock),
    )

    assert results[0].outcome is Outcome.SENT
    assert closed == [True]


@pytest.mark.parametrize("kind", ["http", "smtp"])
def test_a_real_channel_batch_leaves_no_task_behind(
    kind, system_clock, make_real_envelope, http_sink, smtp_sink
):
    """The engine awaits every task it starts, and the channel closes its own: nothing is
    left running once a real network batch returns (a Session has nothing to clean up)."""
    from delivery import deliver
    from delivery.channels import HttpChannel, HttpSettings, SmtpChannel, SmtpSettings

    if kind == "http":
        channel = HttpChannel(
            HttpSettings(url=http_sink.url, secret="test-secret"), clock=system_clock
        )
    else:
        settings = SmtpSettings(host="127.0.0.1", port=smtp_sink.port, from_email="r@example.org")
        channel = SmtpChannel(settings, clock=system_clock)

    async def scenario():
        envelopes = [make_real_envelope() for _ in range(20)]
        policy = DeliveryLimits(concurrency=10)
        results = await deliver(envelopes, channel, policy=policy, clock=system_clock)
        return results, await tasks_left()

    results, leftover = run(scenario())

    assert [r.outcome for r in results] == [Outcome.SENT] * 20
    assert leftover == []
