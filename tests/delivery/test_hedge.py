"""First result wins, only across channels that honour idempotency keys."""

from __future__ import annotations

import asyncio

import pytest

from delivery import (
    HedgePermanentError,
    HedgeRefusedError,
    HedgeTransientError,
    PermanentError,
    TransientError,
)
from delivery.channels import SmtpChannel, SmtpSettings
from delivery.hedge import hedged_send
from tests.delivery.conftest import run
from tests.support.memory_channel import MemoryChannel

pytestmark = pytest.mark.timeout(30)


def channels(clock, *delays):
    """Return keyed memory channels named a, b, c... answering after ``delays``."""
    names = "abcdefgh"[: len(delays)]
    return [MemoryChannel(clock=clock, name=n, delay=d) for n, d in zip(names, delays, strict=True)]


def test_the_fastest_success_wins_and_the_others_are_cancelled(fake_clock, make_envelope):
    """Delays 3, 1, 2 s: b wins at 1 s; a and c are cancelled and never finish."""
    a, b, c = channels(fake_clock, 3.0, 1.0, 2.0)
    envelope = make_envelope()

    message_id = run(hedged_send(envelope, [a, b, c], clock=fake_clock))

    assert message_id == "b-1"
    assert fake_clock.monotonic() == 1.0
    assert [call.outcome for call in a.calls + c.calls] == ["cancelled", "cancelled"]
    assert a.messages == c.messages == []
    assert [call.ended_at for call in a.calls + c.calls] == [1.0, 1.0]


def test_a_failure_is_not_a_winner(fake_clock, make_envelope):
    """The fast endpoint fails; the slower one's success is returned."""
    a, b = channels(fake_clock, 0.1, 2.0)
    envelope = make_envelope()
    a.fail(envelope.key, TransientError("HTTP 503"))

    assert run(hedged_send(envelope, [a, b], clock=fake_clock)) == "b-1"


def test_when_every_endpoint_fails_the_error_lists_every_reason(fake_clock, make_envelope):
    a, b, c = channels(fake_clock, 0.1, 0.2, 0.3)
    envelope = make_envelope()
    a.fail(envelope.key, TransientError("a is down"))
    b.fail(envelope.key, PermanentError("b says no"))
    c.fail(envelope.key, TransientError("c is busy", retry_after=4))

    with pytest.raises(HedgeTransientError) as caught:
        run(hedged_send(envelope, [a, b, c], clock=fake_clock))

    assert str(caught.value) == (
        "all 3 hedged endpoints failed: a: TransientError: a is down; "
        "b: PermanentError: b says no; c: TransientError: c is busy"
    )
    assert [name for name, _ in caught.value.failures] == ["a", "b", "c"]
    assert caught.value.retry_after == 4


def test_when_every_endpoint_refuses_permanently_the_failure_is_permanent(
    fake_clock, make_envelope
):
    a, b = channels(fake_clock, 0.1, 0.2)
    envelope = make_envelope()
    a.fail(envelope.key, PermanentError("422 bad address"))
    b.fail(envelope.key, PermanentError("422 bad address"))

    with pytest.raises(HedgePermanentError, match="all 2 hedged endpoints failed"):
        run(hedged_send(envelope, [a, b], clock=fake_clock))


@pytest.mark.parametrize(
    ("second", "reached", "maybe_delivered"),
    [
        (TransientError("connection refused", reached=False), False, False),
        (TransientError("HTTP 503"), True, False),
        (TransientError("timed out after the request was sent", maybe_delivered=True), True, True),
        (RuntimeError("a bug in the channel"), True, True),  # unknown: assume the worst
    ],
)
def test_a_hedge_that_failed_everywhere_was_reached_and_maybe_delivered_if_one_endpoint_was(
    second, reached, maybe_delivered, fake_clock, make_envelope
):
    """What the record makes of the failure (retry, ``failed`` or ``unknown``) rests on these."""
    a, b = channels(fake_clock, 0.1, 0.2)
    envelope = make_envelope()
    a.fail(envelope.key, TransientError("connection refused", reached=False))
    b.fail(envelope.key, second)

    with pytest.raises(HedgeTransientError) as caught:
        run(hedged_send(envelope, [a, b], clock=fake_clock))

    assert (caught.value.reached, caught.value.maybe_delivered) == (reached, maybe_delivered)


@pytest.mark.parametrize("reached", [False, True])
def test_a_hedge_refused_everywhere_was_reached_if_one_endpoint_was(
    reached, fake_clock, make_envelope
):
    a, b = channels(fake_clock, 0.1, 0.2)
    envelope = make_envelope()
    a.fail(envelope.key, PermanentError("no route", reached=False))
    b.fail(envelope.key, PermanentError("422 bad address", reached=reached))

    with pytest.raises(HedgePermanentError) as caught:
        run(hedged_send(envelope, [a, b], clock=fake_clock))

    assert (caught.value.reached, caught.value.maybe_delivered) == (reached, False)


class _Waiting:
    """A keyed channel whose send yields ``spins`` times, then waits for ``go``."""

    honours_idempotency_keys = True

    def __init__(self, name: str, go: asyncio.Event, spins: int) -> None:
        self.name, self.go, self.spins = name, go, spins

    async def send(self, envelope) -> str:
        for _ in range(self.spins):
            await asyncio.sleep(0)
        await self.go.wait()
        return f"{self.name}-1"


def test_two_endpoints_accepting_in_the_same_loop_turn_return_the_first_listed(make_envelope):
    """b waits for the answer before a does, so b's task finishes first in the turn both
    wake in; the id returned is still a's, whatever order the wins are gathered in."""
    from clock import SystemClock

    async def scenario():
        go = asyncio.Event()
        a, b = _Waiting("a", go, spins=3), _Waiting("b", go, spins=0)
        sending = asyncio.ensure_future(hedged_send(make_envelope(), [a, b], clock=SystemClock()))
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(go._waiters) == 2, "the two sends are not both waiting"
        go.set()
        return await sending

    assert run(scenario()) == "a-1"


def test_hedging_is_refused_unless_every_channel_honours_idempotency_keys(
    fake_clock, make_envelope
):
    keyed = MemoryChannel(clock=fake_clock, name="keyed")
    keyless = MemoryChannel(clock=fake_clock, name="keyless", honours_idempotency_keys=False)
    smtp = SmtpChannel(SmtpSettings(host="127.0.0.1", from_email="r@example.com"), clock=fake_clock)

    with pytest.raises(HedgeRefusedError, match="refusing to hedge across 'keyless'"):
        run(hedged_send(make_envelope(), [keyed, keyless], clock=fake_clock))
    with pytest.raises(HedgeRefusedError, match="refusing to hedge across 'smtp'"):
        run(hedged_send(make_envelope(), [keyed, smtp], clock=fake_clock))
    assert keyed.calls == keyless.calls == []


def test_a_stagger_sends_the_hedge_only_when_the_first_is_slow(fake_clock, make_envelope):
    """With the default 0.5 s stagger, b starts at 0.5 s (a is slow) and wins at 1.5 s."""
    a, b = channels(fake_clock, 5.0, 1.0)

    assert run(hedged_send(make_envelope(), [a, b], clock=fake_clock, stagger=0.5)) == "b-1"
    assert [call.started_at for call in a.calls + b.calls] == [0.0, 0.5]
    assert fake_clock.monotonic() == 1.5


def test_a_stagger_is_cut_short_when_the_first_endpoint_fails(fake_clock, make_envelope):
    a, b = channels(fake_clock, 0.5, 1.0)
    envelope = make_envelope()
    a.fail(envelope.key, TransientError("HTTP 502"))

    assert run(hedged_send(envelope, [a, b], clock=fake_clock, stagger=10.0)) == "b-1"
    assert b.calls[0].started_at == 0.5
