"""Session: several batches from synchronous code on one event loop, channel and limiter."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import signal
import statistics
import threading

import pytest

from delivery import DeliveryLimits, Outcome, Session
from delivery.limiter import LocalRateLimiter
from delivery.session import Interrupted
from tests.delivery.conftest import run
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)

CHUNK = contextvars.ContextVar("chunk", default="none")


class _Recording(MemoryChannel):
    """Records the loop and the caller's context variable each send ran under."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.chunks: list[str] = []

    async def send(self, envelope):
        self.loops.append(asyncio.get_running_loop())
        self.chunks.append(CHUNK.get())
        return await super().send(envelope)


def test_a_sessions_batches_share_one_loop_channel_and_limiter_each_opened_and_closed_once(
    system_clock, make_real_envelope
):
    built: list[_Recording] = []
    limiters: list[LocalRateLimiter] = []
    closed: list[LocalRateLimiter] = []

    class TrackedLimiter(LocalRateLimiter):
        async def aclose(self):
            closed.append(self)

    def channel_factory():
        asyncio.get_running_loop()  # raises unless called inside the loop
        built.append(_Recording(clock=system_clock))
        return built[-1]

    def limiter_factory():
        limiters.append(TrackedLimiter(1000, clock=system_clock))
        return limiters[-1]

    with Session(channel_factory, clock=system_clock, limiter_factory=limiter_factory) as session:
        for _ in range(3):
            results = session.deliver(
                [make_real_envelope() for _ in range(4)], policy=DeliveryLimits()
            )
            assert [r.outcome for r in results] == [Outcome.SENT] * 4
        # Still open between and after the batches: closing is the session's.
        assert (built[0].opened, built[0].closed) == (1, 0)
        assert closed == []

    assert len(built) == 1 and (built[0].opened, built[0].closed) == (1, 1)
    assert len(set(map(id, built[0].loops))) == 1 and len(built[0].loops) == 12
    assert len(limiters) == 1 and closed == limiters
    # Closed again (a worker's shutdown hook after the with): nothing more to do, at once.
    again = threading.Thread(target=session.close, daemon=True)
    again.start()
    again.join(5)
    assert not again.is_alive(), "a second close waits for a loop that is gone"
    assert (built[0].closed, len(closed)) == (1, 1)


def test_the_loop_does_not_run_between_a_sessions_batches(system_clock, make_real_envelope):
    """Between chunks the caller works with the ORM: nothing asynchronous may run meanwhile."""
    ran: list[float] = []

    class Scheduling(MemoryChannel):
        async def send(self, envelope):
            if not self.calls:
                asyncio.get_running_loop().call_later(
                    0.25, lambda: ran.append(system_clock.monotonic())
                )
            else:
                await asyncio.sleep(0.1)  # the second batch gives the loop time to run
            return await super().send(envelope)

    with Session(lambda: Scheduling(clock=system_clock), clock=system_clock) as session:
        session.deliver([make_real_envelope()], policy=DeliveryLimits())
        between = system_clock.monotonic()
        # The callback is due 0.25 s after the first send (the batch's own last steps, late
        # on a loaded host, must not reach it).
        system_clock.sleep_blocking(0.6)
        assert ran == []
        session.deliver([make_real_envelope()], policy=DeliveryLimits())

    # It ran at the next batch, not while the caller slept.
    assert len(ran) >= 1 and ran[0] >= between + 0.6


def test_a_channel_that_fails_to_open_is_tried_again_at_the_next_batch(
    system_clock, make_real_envelope
):
    class Flaky(MemoryChannel):
        tries = 0

        async def __aenter__(self):
            Flaky.tries += 1
            if Flaky.tries == 1:
                raise OSError("connection refused")
            return await super().__aenter__()

    channel = Flaky(clock=system_clock)
    with Session(lambda: channel, clock=system_clock) as session:
        [first] = session.deliver([make_real_envelope()], policy=DeliveryLimits())
        [second] = session.deliver([make_real_envelope()], policy=DeliveryLimits())

    assert first.outcome is Outcome.TRANSIENT and "could not be opened" in first.error
    assert not first.provider_reached
    assert second.outcome is Outcome.SENT
    assert Flaky.tries == 2 and (channel.opened, channel.closed) == (1, 1)


def test_each_batch_runs_in_its_callers_context(system_clock, make_real_envelope):
    """The claim a log line carries (reminders/worker/logcontext.py) is the chunk's, not the first's."""
    channel = _Recording(clock=system_clock)
    with Session(lambda: channel, clock=system_clock) as session:
        for name in ("first", "second"):
            token = CHUNK.set(name)
            try:
                session.deliver([make_real_envelope() for _ in range(2)], policy=DeliveryLimits())
            finally:
                CHUNK.reset(token)

    assert channel.chunks == ["first", "first", "second", "second"]


def test_an_interruption_in_one_batch_stops_it_and_the_session_still_closes(
    system_clock, make_real_envelope
):
    """A soft time limit raised into the waiting thread: the batch drains and reports."""
    channel = MemoryChannel(clock=system_clock)
    envelopes = [make_real_envelope(), make_real_envelope()]
    channel.hang(envelopes[1].key)
    raised = False

    def tick():
        nonlocal raised
        # Once the first call is done, the second hangs: however late the host ran them.
        if not raised and channel.messages:
            raised = True
            raise KeyboardInterrupt  # what a signal handler raises into the wait

    with Session(lambda: channel, clock=system_clock) as session:
        with pytest.raises(Interrupted) as caught:
            session.deliver(
                envelopes,
                policy=DeliveryLimits(call_timeout=20, drain=0.1),
                tick=tick,
                tick_interval=0.05,
            )

    assert isinstance(caught.value.cause, KeyboardInterrupt)
    assert [r.outcome for r in caught.value.results] == [Outcome.SENT, Outcome.CANCELLED]
    assert (channel.opened, channel.closed) == (1, 1)


@pytest.mark.parametrize("waits_in", ["backoff", "limiter"])
def test_a_stop_flag_set_while_a_call_waits_ends_the_batch_at_the_next_tick(
    waits_in, system_clock, make_real_envelope, limiter_redis_url, redis_account
):
    """A call waits 20 s: to try again after a failure (``backoff``), or in the real Redis
    limiter for its reserved start, one start per 20 s (``limiter``: the first envelope
    took the window's only start). The caller's flag is set by another thread 0.1 s after
    the first call began (as the worker's main process sets its shutdown flag). Nothing in the loop looks at it: the
    waiting thread does, at its next tick, and wakes the batch, which ends at once, with
    no further call."""
    from delivery.errors import TransientError
    from delivery.limiter import RedisRateLimiter

    channel = MemoryChannel(clock=system_clock)
    limiter_factory = None
    if waits_in == "backoff":
        envelopes = [make_real_envelope()]
        channel.fail(envelopes[0].key, TransientError("busy"))
    else:
        envelopes = [make_real_envelope(), make_real_envelope()]

        def limiter_factory():
            return RedisRateLimiter(
                url=limiter_redis_url,
                account=redis_account,
                per_second=1,
                window=20,
                clock=system_clock,
            )

    flag = threading.Event()

    def stop_once_a_call_began() -> None:
        """A loaded host may start the first call late: set the flag only when it began."""
        until = system_clock.monotonic() + 10
        while not channel.calls and system_clock.monotonic() < until:
            system_clock.sleep_blocking(0.01)
        system_clock.sleep_blocking(0.1)  # the call now waits in backoff or in the limiter
        flag.set()

    timer = threading.Thread(target=stop_once_a_call_began)
    policy = DeliveryLimits(call_timeout=5, max_attempts=3, backoff_base=20, jitter=0)
    begun = system_clock.monotonic()
    with Session(lambda: channel, clock=system_clock, limiter_factory=limiter_factory) as session:
        timer.start()
        results = session.deliver(envelopes, policy=policy, stop=flag, tick_interval=0.05)
    took = system_clock.monotonic() - begun
    timer.join()

    assert len(channel.calls) == 1, channel.calls
    assert results[-1].outcome is not Outcome.SENT
    if waits_in == "backoff":
        assert results[0].attempts == 1
    else:
        assert results[0].outcome is Outcome.SENT and results[1].attempts == 0, results
    assert took < 5, f"the batch ended {took:.1f} s in, not at the tick after the flag"


def test_a_stop_flag_is_read_at_every_call_start_not_only_at_the_callers_tick(
    system_clock, make_real_envelope
):
    """Calls start 51 ms apart (a limiter at 20/s) and another thread sets the caller's flag
    after the third. The calling thread ticks every 30 s only, so nothing relays the flag:
    the engine reads it before each start, and no later call begins."""
    channel = MemoryChannel(clock=system_clock)
    flag = threading.Event()
    set_at: list[float] = []

    def stop_after_three_calls() -> None:
        until = system_clock.monotonic() + 10
        while len(channel.calls) < 3 and system_clock.monotonic() < until:
            system_clock.sleep_blocking(0.005)
        set_at.append(system_clock.monotonic())
        flag.set()

    def limiter():
        return LocalRateLimiter(20, clock=system_clock)

    timer = threading.Thread(target=stop_after_three_calls)
    with Session(lambda: channel, clock=system_clock, limiter_factory=limiter) as session:
        timer.start()
        results = session.deliver(
            [make_real_envelope() for _ in range(40)],
            policy=DeliveryLimits(concurrency=5),
            stop=flag,
            tick_interval=30,
        )
    timer.join()

    # One start that read the flag just before it was set may still follow it.
    assert len([t for t in channel.start_times if t > set_at[0]]) <= 1
    assert 3 <= len(channel.calls) < 40
    assert results[-1].outcome is Outcome.CANCELLED


def test_the_calling_thread_ticks_at_the_interval_it_asked_for(system_clock, make_real_envelope):
    """The worker refreshes its claim watch from the tick. Asked for every 0.05 s (a fifth
    of the default), the ticks come no sooner, and typically no more than 0.1 s late on a
    loaded host: the median gap stays well under the default's 0.25 s."""
    channel = MemoryChannel(clock=system_clock, delay=1.0)
    ticks: list[float] = []

    with Session(lambda: channel, clock=system_clock) as session:
        session.deliver(
            [make_real_envelope()],
            policy=DeliveryLimits(),
            tick=lambda: ticks.append(system_clock.monotonic()),
            tick_interval=0.05,
        )

    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    assert len(gaps) >= 4, ticks
    assert min(gaps) >= 0.045, gaps
    assert statistics.median(gaps) < 0.15, gaps


def test_a_channels_own_concurrency_cap_holds_through_a_session(system_clock, make_real_envelope):
    channel = MemoryChannel(clock=system_clock, delay=0.1, max_concurrency=2)

    with Session(lambda: channel, clock=system_clock) as session:
        session.deliver([make_real_envelope() for _ in range(6)], policy=DeliveryLimits())

    assert channel.peak_in_flight == 2


def test_a_channel_that_hangs_on_close_holds_the_session_no_longer_than_close_timeout(
    system_clock, make_real_envelope, caplog
):
    class HangsOnClose(MemoryChannel):
        async def __aexit__(self, *exc_info):
            await asyncio.sleep(60)

    with caplog.at_level(logging.WARNING, logger="delivery"):
        with Session(
            lambda: HangsOnClose(clock=system_clock), clock=system_clock, close_timeout=0.2
        ) as session:
            results = session.deliver([make_real_envelope()], policy=DeliveryLimits())
            closing = system_clock.monotonic()

    assert results[0].outcome is Outcome.SENT
    assert system_clock.monotonic() - closing < 10
    assert "Channel memory did not close cleanly" in caplog.text


def test_a_session_refuses_to_open_inside_a_running_event_loop(system_clock):
    async def inside_a_loop():
        with Session(lambda: MemoryChannel(clock=system_clock), clock=system_clock):
            pass

    with pytest.raises(RuntimeError, match=r"await delivery\.deliver\(\) there instead"):
        run(inside_a_loop())


def test_deliver_needs_the_session_open(system_clock, make_real_envelope):
    session = Session(lambda: MemoryChannel(clock=system_clock), clock=system_clock)
    with pytest.raises(RuntimeError, match="use 'with Session"):
        session.deliver([make_real_envelope()], policy=DeliveryLimits())


def test_a_limiter_that_fails_to_build_never_leaves_a_batch_without_its_limit(
    system_clock, make_real_envelope
):
    built: list[LocalRateLimiter] = []
    starts: list[int] = []

    class Counting(LocalRateLimiter):
        async def acquire(self, *, deadline_at=None):
            starts.append(1)
            return await super().acquire(deadline_at=deadline_at)

    def limiter_factory():
        if not built:
            built.append(None)
            raise ConnectionError("Redis is restarting")
        built.append(Counting(1000, clock=system_clock))
        return built[-1]

    channel = MemoryChannel(clock=system_clock)
    with Session(lambda: channel, clock=system_clock, limiter_factory=limiter_factory) as session:
        with pytest.raises(ConnectionError):
            session.deliver([make_real_envelope()], policy=DeliveryLimits())
        results = session.deliver([make_real_envelope() for _ in range(3)], policy=DeliveryLimits())

    assert [r.outcome for r in results] == [Outcome.SENT] * 3
    assert len(built) == 2 and len(starts) == 3  # the second batch was limited
    assert len(channel.calls) == 3  # nothing went out unlimited


def test_a_task_the_open_channel_owns_survives_the_batches_and_ends_with_the_session(
    system_clock, make_real_envelope
):
    """aiohttp, for one, shields a DNS lookup from a cancelled request; between chunks
    such a task is the channel's, not a leftover of the batch."""
    owned: list[asyncio.Task] = []

    class Owning(MemoryChannel):
        async def __aenter__(self):
            owned.append(asyncio.get_running_loop().create_task(asyncio.sleep(30), name="owned"))
            return await super().__aenter__()

    with Session(lambda: Owning(clock=system_clock), clock=system_clock) as session:
        for _ in range(2):
            session.deliver([make_real_envelope()], policy=DeliveryLimits())
            assert not owned[0].done()

    assert owned[0].cancelled()  # the session's close ends it


class _SoftLimit(Exception):
    """What Celery's soft time limit raises into the worker's main thread."""


class _SlowToClose(MemoryChannel):
    async def __aexit__(self, *exc_info):
        await asyncio.sleep(0.5)
        return await super().__aexit__(*exc_info)


@pytest.mark.parametrize("leaving_on", [None, LookupError], ids=["normally", "on-an-exception"])
def test_an_interruption_while_the_session_closes_lets_the_close_finish_then_goes_on(
    system_clock, make_real_envelope, caplog, leaving_on
):
    """The signal lands while the channel closes: the close runs to its end (channel, loop
    and its thread), then the interruption is raised, unless the session is left on an
    exception already: that one goes on, the interruption is logged."""
    channel = _SlowToClose(clock=system_clock)

    def soft_limit(signum, frame):
        raise _SoftLimit

    previous = signal.signal(signal.SIGALRM, soft_limit)
    try:
        with pytest.raises(leaving_on or _SoftLimit):
            with Session(lambda: channel, clock=system_clock) as session:
                session.deliver([make_real_envelope()], policy=DeliveryLimits())
                signal.setitimer(signal.ITIMER_REAL, 0.1)
                if leaving_on:
                    raise leaving_on
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    assert channel.closed == 1
    assert session._thread is None
    assert not [t for t in threading.enumerate() if t.name == "delivery-loop"]
    logged = [r.getMessage() for r in caplog.records if r.name == "delivery"]
    assert logged == (["Delivery session did not close cleanly"] if leaving_on else [])


def test_an_interruption_while_the_loop_thread_ends_waits_for_it_then_goes_on(
    system_clock, make_real_envelope
):
    """The channel is closed; the loop's last task takes 2 s to end once cancelled (as a
    channel's own cleanup may) and the signal lands 0.2 s in, while the session waits for
    its thread: the wait goes on to the thread's end, then the interruption is raised."""
    ended: list[bool] = []

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.shield(asyncio.sleep(2))
            ended.append(True)

    class Owning(MemoryChannel):
        async def __aenter__(self):
            asyncio.get_running_loop().create_task(slow_to_end())
            return await super().__aenter__()

    def soft_limit(signum, frame):
        raise _SoftLimit

    previous = signal.signal(signal.SIGALRM, soft_limit)
    try:
        with pytest.raises(_SoftLimit):
            with Session(lambda: Owning(clock=system_clock), clock=system_clock) as session:
                session.deliver([make_real_envelope()], policy=DeliveryLimits())
                signal.setitimer(signal.ITIMER_REAL, 0.2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    assert ended == [True]
    assert session._thread is None
    assert not [t for t in threading.enumerate() if t.name == "delivery-loop"]


def test_a_limiter_that_fails_to_close_is_logged_and_the_session_still_closes(
    system_clock, make_real_envelope, caplog
):
    class Unclosable(LocalRateLimiter):
        async def aclose(self):
            raise ConnectionError("Redis went away")

    channel = MemoryChannel(clock=system_clock)
    limiter_factory = lambda: Unclosable(1000, clock=system_clock)  # noqa: E731
    with Session(lambda: channel, clock=system_clock, limiter_factory=limiter_factory) as session:
        session.deliver([make_real_envelope()], policy=DeliveryLimits())

    assert channel.closed == 1
    assert session._thread is None
    assert [r.getMessage() for r in caplog.records if r.name == "delivery"] == [
        "Rate limiter did not close cleanly"
    ]
