"""The fan-out engine on a FakeClock: limits, timeouts, retries, deadlines, stopping."""

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
from loopback.windows import max_in_window
from tests.delivery.conftest import run, tasks_left
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)

FAST = DeliveryLimits(concurrency=5, call_timeout=10, max_attempts=3, backoff_base=1, jitter=0)


def test_peak_in_flight_calls_never_exceed_the_concurrency_limit(fake_clock, make_envelope):
    """Forty one-second calls with a limit of five run five at a time, in eight seconds."""
    channel = MemoryChannel(clock=fake_clock, delay=1.0)
    envelopes = [make_envelope() for _ in range(40)]

    results = run(deliver(envelopes, channel, policy=FAST, clock=fake_clock))

    assert [r.outcome for r in results] == [Outcome.SENT] * 40
    assert channel.peak_in_flight == 5
    assert fake_clock.monotonic() == pytest.approx(8.0)


def test_a_channel_cap_lowers_the_policy_concurrency(fake_clock, make_envelope):
    """A channel declaring max_concurrency=2 never sees a third call at once."""
    channel = MemoryChannel(clock=fake_clock, delay=1.0, max_concurrency=2)

    run(deliver([make_envelope() for _ in range(6)], channel, policy=FAST, clock=fake_clock))

    assert channel.peak_in_flight == 2


def test_results_come_back_in_envelope_order_exactly_one_each(fake_clock, make_envelope):
    """Calls finishing in reverse order still yield results in the order given."""
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(6)]
    for position, envelope in enumerate(envelopes):
        channel.slow(envelope.key, 6.0 - position)

    results = run(deliver(envelopes, channel, policy=FAST, clock=fake_clock))

    assert [r.reminder_id for r in results] == [e.reminder_id for e in envelopes]
    assert [r.key for r in results] == [e.key for e in envelopes]


def test_a_slow_call_ends_timed_out_while_the_rest_succeed(fake_clock, make_envelope):
    """The batch ends at the call timeout (2 s), not at the slow call's 100 s."""
    channel = MemoryChannel(clock=fake_clock, delay=0.5)
    envelopes = [make_envelope() for _ in range(4)]
    channel.slow(envelopes[1].key, 100.0)
    policy = DeliveryLimits(concurrency=4, call_timeout=2.0, max_attempts=1)

    results = run(deliver(envelopes, channel, policy=policy, clock=fake_clock))

    slow = results[1]
    assert slow.outcome is Outcome.TIMED_OUT
    assert (slow.attempts, slow.provider_reached, slow.maybe_delivered) == (1, True, True)
    assert slow.error.startswith("gave up after 1 tries (max_attempts=1); last error: provider")
    assert [r.outcome for r in results[:1] + results[2:]] == [Outcome.SENT] * 3
    assert fake_clock.monotonic() == pytest.approx(2.0)
    assert channel.calls_for(envelopes[1].key)[0].outcome == "cancelled"


def test_a_timed_out_call_is_not_retried_without_idempotency_keys(fake_clock, make_envelope):
    """A lost answer on a keyless channel ends the envelope: a retry could send twice."""
    channel = MemoryChannel(clock=fake_clock, honours_idempotency_keys=False)
    envelope = make_envelope()
    channel.slow(envelope.key, 100.0)
    policy = DeliveryLimits(call_timeout=2.0, max_attempts=3)

    [result] = run(deliver([envelope], channel, policy=policy, clock=fake_clock))

    assert result.outcome is Outcome.TIMED_OUT
    assert result.attempts == 1
    assert result.error == (
        "provider call exceeded call_timeout=2s; not retried: the provider may have accepted it "
        "and channel 'memory' does not honour idempotency keys"
    )


def test_a_timed_out_call_is_retried_with_the_same_key_where_keys_are_honoured(
    fake_clock, make_envelope
):
    """A channel that deduplicates by key gets a second try after a timeout."""
    channel = MemoryChannel(clock=fake_clock, honours_idempotency_keys=True)
    envelope = make_envelope()
    channel.slow(envelope.key, 100.0)
    policy = DeliveryLimits(call_timeout=2.0, max_attempts=3, backoff_base=1, jitter=0)

    [result] = run(deliver([envelope], channel, policy=policy, clock=fake_clock))

    assert result.outcome is Outcome.SENT
    assert result.attempts == 2
    assert [c.key for c in channel.calls] == [envelope.key, envelope.key]


def test_transient_failures_are_retried_with_exponential_backoff_and_jitter(
    fake_clock, make_envelope
):
    """Waits of 1, 2, 4 s shortened by jitter 0.5 x draw 0.5 put tries at 0, .75, 2.25, 5.25."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, *(TransientError("busy") for _ in range(3)))
    policy = DeliveryLimits(max_attempts=4, backoff_base=1, backoff_max=60, jitter=0.5)

    [result] = run(
        deliver([envelope], channel, policy=policy, clock=fake_clock, random=lambda: 0.5)
    )

    assert result.outcome is Outcome.SENT
    assert result.attempts == 4
    assert channel.start_times == pytest.approx([0.0, 0.75, 2.25, 5.25])


def test_backoff_is_capped_and_jitter_only_shortens_it():
    """The tenth retry waits backoff_max at most, and a full draw takes off jitter x wait."""
    policy = DeliveryLimits(backoff_base=1, backoff_max=5, jitter=0.2)

    assert policy.backoff(10, draw=0.0) == 5.0
    assert policy.backoff(10, draw=0.999999) == pytest.approx(4.0, abs=1e-5)
    assert policy.backoff(1, draw=0.0) == 1.0
    assert policy.backoff(1, draw=0.0, retry_after=30.0) == 30.0


def test_retry_after_from_the_provider_is_honoured(fake_clock, make_envelope):
    """A provider asking for 7 s gets 7 s, though the backoff alone would be 1 s."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("slow down", retry_after=7))

    [result] = run(deliver([envelope], channel, policy=FAST, clock=fake_clock))

    assert result.outcome is Outcome.SENT
    assert channel.start_times == pytest.approx([0.0, 7.0])


def test_no_retry_starts_at_or_after_the_deadline(fake_clock, make_envelope):
    """A retry due after the deadline is not waited for: the envelope ends at once."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=5))
    channel.fail(envelope.key, TransientError("HTTP 503", retry_after=10))

    [result] = run(deliver([envelope], channel, policy=FAST, clock=fake_clock))

    assert result.outcome is Outcome.TRANSIENT
    assert result.attempts == 1
    assert result.error == (
        "HTTP 503; not retried: the next try (in 10s) would start at or after the deadline"
    )
    assert fake_clock.monotonic() == 0.0  # it did not sleep towards the deadline
    assert len(channel.calls) == 1


def test_a_retry_after_past_the_calendar_ends_the_envelope_not_the_engine(
    fake_clock, make_envelope
):
    """Any channel's wait of centuries (a provider's Retry-After) is past the deadline; adding
    it to a date overflowed, and the envelope ended PERMANENT as an engine error."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("greylisted", retry_after=1e12))

    [result] = run(deliver([envelope], channel, policy=FAST, clock=fake_clock))

    assert result.outcome is Outcome.TRANSIENT, result.error
    assert "would start at or after the deadline" in result.error


def test_a_deadline_passing_while_waiting_for_a_slot_expires_the_envelope(
    fake_clock, make_envelope
):
    """Behind a 10 s call with one slot, an envelope due in 5 s is never sent."""
    channel = MemoryChannel(clock=fake_clock)
    blocker = make_envelope()
    late = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=5))
    channel.slow(blocker.key, 10.0)
    policy = DeliveryLimits(concurrency=1, call_timeout=20)

    results = run(deliver([blocker, late], channel, policy=policy, clock=fake_clock))

    assert results[0].outcome is Outcome.SENT
    assert results[1].outcome is Outcome.EXPIRED
    assert (results[1].attempts, results[1].provider_reached) == (0, False)
    assert results[1].error == (
        "deadline 2026-03-02T09:00:05+00:00 reached before the call could start"
    )
    assert channel.calls_for(late.key) == []


def test_envelopes_past_their_deadline_expire_without_opening_the_channel(
    fake_clock, make_envelope
):
    """A batch of stale envelopes (a queue backlog) calls nothing at all."""
    channel = MemoryChannel(clock=fake_clock)
    stale = [make_envelope(deadline_at=fake_clock.now()) for _ in range(3)]

    results = run(deliver(stale, channel, policy=FAST, clock=fake_clock))

    assert [r.outcome for r in results] == [Outcome.EXPIRED] * 3
    assert not any(r.provider_reached for r in results)
    assert channel.opened == 0


def test_a_permanent_failure_is_not_retried(fake_clock, make_envelope):
    """A provider's 'no such user' ends the envelope after one call."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, PermanentError("550 no such user"))

    [result] = run(deliver([envelope], channel, policy=FAST, clock=fake_clock))

    assert (result.outcome, result.attempts, result.error) == (
        Outcome.PERMANENT,
        1,
        "550 no such user",
    )
    assert result.maybe_delivered is False


def test_an_unexpected_exception_from_a_channel_is_a_result_not_a_crash(fake_clock, make_envelope):
    """A channel bug fails its envelope permanently; the rest of the batch is sent."""
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(3)]
    channel.fail(envelopes[0].key, KeyError("workshop_title"))

    results = run(deliver(envelopes, channel, policy=FAST, clock=fake_clock))

    assert results[0].outcome is Outcome.PERMANENT
    assert results[0].error == "unexpected KeyError from channel 'memory': 'workshop_title'"
    assert results[0].attempts == 1
    assert results[0].maybe_delivered is True
    assert [r.outcome for r in results[1:]] == [Outcome.SENT, Outcome.SENT]


@pytest.mark.parametrize(
    ("honours_keys", "outcome", "attempts"),
    [(True, Outcome.SENT, 2), (False, Outcome.TRANSIENT, 1)],
)
def test_a_lost_connection_is_retried_only_where_keys_are_honoured(
    fake_clock, make_envelope, honours_keys, outcome, attempts
):
    """An OSError or OutcomeUnknownError may have delivered: retried only with keys."""
    for error in (ConnectionResetError("reset by peer"), OutcomeUnknownError("answer lost")):
        channel = MemoryChannel(clock=fake_clock, honours_idempotency_keys=honours_keys)
        envelope = make_envelope()
        channel.fail(envelope.key, error)

        [result] = run(deliver([envelope], channel, policy=FAST, clock=fake_clock))

        assert (result.outcome, result.attempts) == (outcome, attempts)
        assert result.maybe_delivered is True


def test_failures_that_never_reached_the_provider_say_so(fake_clock, make_envelope):
    """Three refused connections: transient, three attempts, provider not reached."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(
        envelope.key, *(TransientError("connection refused", reached=False) for _ in range(3))
    )

    [result] = run(deliver([envelope], channel, policy=FAST, clock=fake_clock))

    assert result.outcome is Outcome.TRANSIENT
    assert result.attempts == 3
    assert (result.provider_reached, result.maybe_delivered) == (False, False)
    assert result.error == (
        "gave up after 3 tries (max_attempts=3); last error: connection refused"
    )


def test_a_retrying_envelope_gives_its_slot_back_while_backing_off(fake_clock, make_envelope):
    """With one slot, two one-second calls finish during a 10 s backoff of a third."""
    channel = MemoryChannel(clock=fake_clock)
    first, second, third = (make_envelope() for _ in range(3))
    channel.fail(first.key, TransientError("greylisted", retry_after=10))
    channel.slow(second.key, 1.0)
    channel.slow(third.key, 1.0)
    policy = DeliveryLimits(concurrency=1, call_timeout=5)

    results = run(deliver([first, second, third], channel, policy=policy, clock=fake_clock))

    assert [r.outcome for r in results] == [Outcome.SENT] * 3
    assert [(c.key, c.started_at) for c in channel.calls] == [
        (first.key, 0.0),
        (second.key, 0.0),
        (third.key, 1.0),
        (first.key, 10.0),
    ]
    assert channel.peak_in_flight == 1


def test_a_stop_signal_cancels_unfinished_calls_and_returns_partial_results(
    fake_clock, make_envelope
):
    """Stopped at 5 s: the sent one stays sent, in-flight ones may have been reached,
    queued ones were certainly not, every cleanup ran and no task is left."""
    channel = MemoryChannel(clock=fake_clock, delay=1.0)
    envelopes = [make_envelope() for _ in range(5)]
    channel.hang(envelopes[1].key)
    channel.hang(envelopes[2].key)
    stop = asyncio.Event()
    policy = DeliveryLimits(concurrency=2, call_timeout=60)

    async def scenario():
        async def stopper():
            await fake_clock.sleep(5)
            stop.set()

        async with asyncio.TaskGroup() as group:
            group.create_task(stopper())
            results = await deliver(envelopes, channel, policy=policy, clock=fake_clock, stop=stop)
        return results, await tasks_left()

    results, leftover = run(scenario())

    assert [r.outcome for r in results] == [Outcome.SENT] + [Outcome.CANCELLED] * 4
    for in_flight in results[1:3]:
        assert (in_flight.attempts, in_flight.provider_reached) == (1, True)
        assert in_flight.maybe_delivered is True
        assert in_flight.error == "stopped (stop signal) while call 1 was in flight"
    for queued in results[3:]:
        assert (queued.attempts, queued.provider_reached) == (0, False)
        assert queued.error == "stopped (stop signal) before the first attempt"
    assert [channel.calls_for(e.key)[0].outcome for e in envelopes[1:3]] == ["cancelled"] * 2
    assert channel.closed == 1
    assert leftover == []
    assert fake_clock.monotonic() == pytest.approx(5.0)


def test_a_stop_during_backoff_reports_the_attempts_already_made(fake_clock, make_envelope):
    """Stopped while waiting to retry: cancelled, one attempt, last error kept."""
    channel = MemoryChannel(clock=fake_clock)
    envelope = make_envelope()
    channel.fail(envelope.key, TransientError("HTTP 503", retry_after=100))
    stop = asyncio.Event()

    async def scenario():
        async def stopper():
            await fake_clock.sleep(5)
            stop.set()

        async with asyncio.TaskGroup() as group:
            group.create_task(stopper())
            return await deliver([envelope], channel, policy=FAST, clock=fake_clock, stop=stop)

    [result] = run(scenario())

    assert result.outcome is Outcome.CANCELLED
    assert (result.attempts, result.provider_reached, result.maybe_delivered) == (1, True, False)
    assert result.error == "stopped (stop signal) after 1 attempts; last error: HTTP 503"


def test_the_budget_running_out_stops_the_batch_like_a_stop_signal(fake_clock, make_envelope):
    """A three-second budget cancels a hanging call at three seconds."""
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(2)]
    channel.hang(envelopes[0].key)
    policy = DeliveryLimits(call_timeout=60, budget=3)

    async def scenario():
        results = await deliver(envelopes, channel, policy=policy, clock=fake_clock)
        return results, await tasks_left()

    results, leftover = run(scenario())

    assert results[0].outcome is Outcome.CANCELLED
    assert results[0].error == "stopped (budget of 3s used up) while call 1 was in flight"
    assert results[1].outcome is Outcome.SENT
    assert fake_clock.monotonic() == pytest.approx(3.0)
    assert leftover == []


def test_a_stop_set_before_the_batch_starts_calls_nothing(fake_clock, make_envelope):
    """Every envelope is cancelled and certainly not reached; the channel is not even opened
    (a warm shutdown does not wait on a connection it will not use)."""
    channel = MemoryChannel(clock=fake_clock)
    stop = asyncio.Event()
    stop.set()

    results = run(
        deliver(
            [make_envelope() for _ in range(3)], channel, policy=FAST, clock=fake_clock, stop=stop
        )
    )

    assert [r.outcome for r in results] == [Outcome.CANCELLED] * 3
    assert not any(r.provider_reached for r in results)
    assert (channel.calls, channel.opened) == ([], 0)


def test_two_envelopes_with_one_key_are_delivered_once(fake_clock, make_envelope):
    """The second envelope carrying a key already in the batch fails without a call."""
    channel = MemoryChannel(clock=fake_clock)
    first = make_envelope(1, key="attendee-7:workshop-3")
    second = make_envelope(2, key="attendee-7:workshop-3")

    results = run(deliver([first, second], channel, policy=FAST, clock=fake_clock))

    assert results[0].outcome is Outcome.SENT
    assert results[1].outcome is Outcome.PERMANENT
    assert results[1].error == (
        "duplicate key in batch: reminder 1 carries the same key and is the one delivered"
    )
    assert len(channel.calls) == 1


def test_the_same_reminder_twice_refuses_the_whole_batch(fake_clock, make_envelope):
    """Results keyed by reminder id would be ambiguous, so nothing runs."""
    channel = MemoryChannel(clock=fake_clock)

    with pytest.raises(ValueError, match="reminder 4 appears twice in one batch"):
        run(
            deliver(
                [make_envelope(4), make_envelope(4, key="other")],
                channel,
                policy=FAST,
                clock=fake_clock,
            )
        )
    assert channel.calls == []


@pytest.mark.parametrize(
    ("recipient", "error"),
    [
        ("", "recipient address is empty"),
        (
            "person.example.com",
            "recipient address 'person.example.com' is not of the form local@domain",
        ),
        ("a@localhost", "recipient address 'a@localhost' has an invalid domain"),
        (
            "a b@example.com",
            "recipient address 'a b@example.com' contains whitespace or control characters",
        ),
        (
            "ok@example.com\r\nBcc: x@example.com",
            "recipient address 'ok@example.com\\r\\nBcc: x@example.com' contains whitespace or control characters",
        ),
        ("..a@example.com", "recipient address '..a@example.com' has an invalid local part"),
        ("a@" + "x" * 250 + ".org", "recipient address is longer than 254 characters"),
        (
            "a@" + "x" * 64 + ".org",  # IDNA allows 63 per label
            f"recipient address 'a@{'x' * 64}.org' has a domain that cannot be encoded",
        ),
        (  # IDNA 2008 allows a joiner only after a virama
            "a@a\u200db.example",
            "recipient address 'a@a\\u200db.example' has a domain that cannot be encoded",
        ),
    ],
)
def test_a_bad_recipient_fails_permanently_without_a_provider_call(
    fake_clock, make_envelope, recipient, error
):
    """Bad data in one row is a permanent result for that envelope only."""
    channel = MemoryChannel(clock=fake_clock)
    bad = make_envelope(recipient=recipient)
    good = make_envelope()

    results = run(deliver([bad, good], channel, policy=FAST, clock=fake_clock))

    assert (results[0].outcome, results[0].error) == (Outcome.PERMANENT, error)
    assert (results[0].attempts, results[0].provider_reached) == (0, False)
    assert results[1].outcome is Outcome.SENT
    assert [c.key for c in channel.calls] == [good.key]


class _BrokenChannel(MemoryChannel):
    async def __aenter__(self):
        raise ConnectionRefusedError("provider down")


def test_a_channel_that_cannot_open_fails_every_envelope_without_reaching_the_provider(
    fake_clock, make_envelope
):
    channel = _BrokenChannel(clock=fake_clock)

    results = run(
        deliver([make_envelope() for _ in range(2)], channel, policy=FAST, clock=fake_clock)
    )

    assert [r.outcome for r in results] == [Outcome.TRANSIENT] * 2
    assert results[0].error == (
        "channel 'memory' could not be opened: ConnectionRefusedError('provider down')"
    )
    assert not any(r.provider_reached for r in results)


def test_a_rate_limited_answer_pauses_the_limiter_for_every_envelope(fake_clock, make_envelope):
    """After a 429 asking for 5 s, no call of the batch starts for 5 s."""
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(4)]
    channel.fail(envelopes[0].key, RateLimitedError("HTTP 429", retry_after=5))
    limiter = LocalRateLimiter(100, clock=fake_clock)
    policy = DeliveryLimits(concurrency=1, backoff_base=0.1)

    results = run(deliver(envelopes, channel, policy=policy, clock=fake_clock, limiter=limiter))

    assert [r.outcome for r in results] == [Outcome.SENT] * 4
    assert channel.start_times[0] == 0.0
    assert min(channel.start_times[1:]) == pytest.approx(5.0)


def test_a_limiter_keeps_every_one_second_window_within_the_rate(fake_clock, make_envelope):
    """Fifty calls at seven per second: no window holds more than seven starts."""
    channel = MemoryChannel(clock=fake_clock, delay=0.3)
    limiter = LocalRateLimiter(7, clock=fake_clock)
    policy = DeliveryLimits(concurrency=20)

    results = run(
        deliver(
            [make_envelope() for _ in range(50)],
            channel,
            policy=policy,
            clock=fake_clock,
            limiter=limiter,
        )
    )

    assert [r.outcome for r in results] == [Outcome.SENT] * 50
    assert max_in_window(channel.start_times) == 7
    # 50 starts need 8 windows: the last one starts 7 windows (plus margin) after the first.
    assert channel.start_times[-1] == pytest.approx(7 * 1.02)


def test_a_deadline_reached_while_waiting_for_the_limiter_expires_without_a_call(
    fake_clock, make_envelope
):
    """One start per second and a deadline in half a second: the second envelope expires."""
    channel = MemoryChannel(clock=fake_clock)
    limiter = LocalRateLimiter(1, clock=fake_clock)
    first = make_envelope()
    second = make_envelope(deadline_at=fake_clock.now() + timedelta(seconds=0.5))

    results = run(deliver([first, second], channel, policy=FAST, clock=fake_clock, limiter=limiter))

    assert results[1].outcome is Outcome.EXPIRED
    assert (results[1].attempts, results[1].provider_reached) == (0, False)
    assert len(channel.calls) == 1


class _CancelLosingLimiter(LocalRateLimiter):
    """Each wait drops the cancel that lands in it, as a Redis limiter's round trip can on
    Python 3.11 (redis-py writes under asyncio.wait_for, which then returns the result)."""

    lost = 0

    async def acquire(self, *, deadline_at=None) -> None:
        try:
            await self._clock.sleep(2)
        except asyncio.CancelledError:
            self.lost += 1
        await super().acquire(deadline_at=deadline_at)


def test_a_stop_that_a_limiter_wait_swallowed_still_starts_no_call(fake_clock, make_envelope):
    """The budget ends the batch at 1 s while both envelopes wait in the limiter; their
    cancels are lost there, and the stop flag read after the wait still starts no call."""
    channel = MemoryChannel(clock=fake_clock)
    limiter = _CancelLosingLimiter(10, clock=fake_clock)
    policy = DeliveryLimits(concurrency=2, call_timeout=10, budget=1)

    async def scenario():
        envelopes = [make_envelope() for _ in range(2)]
        results = await deliver(
            envelopes, channel, policy=policy, clock=fake_clock, limiter=limiter
        )
        return results, await tasks_left()

    results, leftover = run(scenario())

    assert limiter.lost == 2
    assert channel.calls == []
    assert [r.outcome for r in results] == [Outcome.CANCELLED] * 2
    assert fake_clock.monotonic() < 1.2  # the second grant is one spread interval on
    assert leftover == []


def test_the_log_line_of_a_failed_send_quotes_no_address_or_name(fake_clock, make_envelope, caplog):
    """Issue 34, item 4: providers echo the recipient; the log keeps ids, not people."""
    envelope = make_envelope(recipient="jane.doe@example.org", recipient_name="Jane Doe")
    channel = MemoryChannel(clock=fake_clock)
    channel.fail(
        envelope.key,
        PermanentError("550 5.1.1 <jane.doe@example.org>: unknown user; Dear Jane Doe"),
    )

    with caplog.at_level("WARNING", logger="delivery"):
        [result] = run(deliver([envelope], channel, policy=DeliveryLimits(), clock=fake_clock))

    assert result.outcome is Outcome.PERMANENT
    logged = caplog.text
    assert f"Reminder {envelope.reminder_id} not sent" in logged
    assert "550 5.1.1 <address>: unknown user; Dear <name>" in logged
    assert "jane.doe@example.org" not in logged and "Jane Doe" not in logged


def test_a_429_without_retry_after_pauses_the_limiter_for_one_window(fake_clock, make_envelope):
    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(3)]
    channel.fail(envelopes[0].key, RateLimitedError("HTTP 429"))
    limiter = LocalRateLimiter(100, clock=fake_clock)
    policy = DeliveryLimits(concurrency=1, backoff_base=0.1)

    results = run(deliver(envelopes, channel, policy=policy, clock=fake_clock, limiter=limiter))

    assert [r.outcome for r in results] == [Outcome.SENT] * 3
    assert min(channel.start_times[1:]) == pytest.approx(limiter.window)


def test_a_429_asking_for_a_year_pauses_every_sender_for_minutes_not_the_year(
    fake_clock, make_envelope
):
    """The pause is shared through Redis and outlives a restart: a provider's Retry-After of a
    year (a bug on its side) stopped every worker for that year, each reminder ending missed.
    Every sender now waits MAX_PAUSE at most; a provider still overloaded answers 429 again.
    The reminder that got the 429 waits as asked (its own retry, past its deadline here)."""
    from delivery.engine import MAX_PAUSE

    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(3)]
    channel.fail(envelopes[0].key, RateLimitedError("HTTP 429", retry_after=366 * 24 * 3600))
    limiter = LocalRateLimiter(100, clock=fake_clock)
    policy = DeliveryLimits(concurrency=1, backoff_base=0.1, budget=2 * MAX_PAUSE)

    results = run(deliver(envelopes, channel, policy=policy, clock=fake_clock, limiter=limiter))

    assert [r.outcome for r in results] == [Outcome.TRANSIENT, Outcome.SENT, Outcome.SENT]
    assert MAX_PAUSE <= 600 and min(channel.start_times[1:]) == pytest.approx(MAX_PAUSE)


def test_a_limiter_that_cannot_pause_is_logged_and_the_batch_goes_on(
    fake_clock, make_envelope, caplog
):
    class Unpausable(LocalRateLimiter):
        async def pause(self, seconds):
            raise ConnectionError("Redis went away")

    channel = MemoryChannel(clock=fake_clock)
    envelopes = [make_envelope() for _ in range(2)]
    channel.fail(envelopes[0].key, RateLimitedError("HTTP 429", retry_after=5))
    limiter = Unpausable(100, clock=fake_clock)

    results = run(deliver(envelopes, channel, policy=FAST, clock=fake_clock, limiter=limiter))

    assert [r.outcome for r in results] == [Outcome.SENT] * 2
    assert "Could not pause the rate limiter" in caplog.text


def test_a_channel_that_fails_to_close_keeps_the_batchs_results(fake_clock, make_envelope, caplog):
    class Unclosable(MemoryChannel):
        async def __aexit__(self, *exc_info):
            raise ConnectionResetError("the provider hung up first")

    results = run(
        deliver([make_envelope()], Unclosable(clock=fake_clock), policy=FAST, clock=fake_clock)
    )

    assert [r.outcome for r in results] == [Outcome.SENT]
    assert "Channel memory did not close cleanly" in caplog.text


def test_a_batch_cancelled_from_outside_still_closes_its_channel(fake_clock, make_envelope):
    """The caller's task is cancelled while a call hangs: the channel is closed, and told why."""
    seen: list[type] = []
    called = asyncio.Event()

    class Recording(MemoryChannel):
        async def send(self, envelope):
            called.set()
            return await super().send(envelope)

        async def __aexit__(self, exc_type, exc, tb):
            seen.append(exc_type)
            return await super().__aexit__(exc_type, exc, tb)

    channel = Recording(clock=fake_clock)
    envelope = make_envelope()
    channel.hang(envelope.key)

    async def scenario():
        task = asyncio.create_task(deliver([envelope], channel, policy=FAST, clock=fake_clock))
        await called.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())

    assert (channel.closed, seen) == (1, [asyncio.CancelledError])
