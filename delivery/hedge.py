"""Send one message to several endpoints and keep the first success.

Two endpoints may both accept it, so every channel must honour idempotency keys.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from clock import Clock
from delivery.channel import Channel
from delivery.envelope import Envelope
from delivery.errors import (
    DeliveryError,
    HedgePermanentError,
    HedgeRefusedError,
    HedgeTransientError,
    PermanentError,
)
from delivery.gate import last_look

__all__ = ["hedged_send"]


class _Won(Exception):
    def __init__(self, index: int, message_id: str) -> None:
        super().__init__(index, message_id)
        self.index = index
        self.message_id = message_id


async def hedged_send(
    envelope: Envelope,
    channels: Sequence[Channel],
    *,
    clock: Clock,
    stagger: float = 0.0,
) -> str:
    """Send ``envelope`` through every open channel; return the first message id.

    Channel *i* starts ``stagger`` seconds after channel *i-1*, or once that one failed.
    """
    unsafe = [c.name for c in channels if not c.honours_idempotency_keys]
    if unsafe:
        raise HedgeRefusedError(
            f"refusing to hedge across {', '.join(map(repr, unsafe))}: without idempotency keys "
            "two endpoints may both deliver the message; send through one channel instead."
        )
    count = len(channels)
    failures: list[BaseException | None] = [None] * count
    started = [asyncio.Event() for _ in range(count)]
    failed = [asyncio.Event() for _ in range(count)]

    async def attempt(index: int, channel: Channel) -> None:
        if index > 0:
            await started[index - 1].wait()
            with contextlib.suppress(TimeoutError):
                async with clock.timeout(stagger):
                    await failed[index - 1].wait()
        started[index].set()
        try:
            if index > 0:
                last_look()  # staff may have withdrawn it during the stagger
            message_id = await channel.send(envelope)
        except Exception as exc:
            failures[index] = exc
            failed[index].set()
            return
        raise _Won(index, message_id)

    winner: _Won | None = None
    try:
        async with asyncio.TaskGroup() as group:
            for index, channel in enumerate(channels):
                group.create_task(attempt(index, channel), name=f"hedge:{channel.name}")
    except* _Won as won:
        # Two endpoints can finish in the same loop turn; the first listed wins.
        winner = min(won.exceptions, key=lambda exc: exc.index)  # type: ignore[attr-defined]
    if winner is not None:
        return winner.message_id
    return _raise_all_failed(channels, failures)


def _raise_all_failed(channels: Sequence[Channel], failures: list[BaseException | None]):
    pairs = tuple(
        (channel.name, exc) for channel, exc in zip(channels, failures, strict=True) if exc
    )
    reached = any(not isinstance(exc, DeliveryError) or exc.reached for _, exc in pairs)
    if all(isinstance(exc, PermanentError) for _, exc in pairs):
        raise HedgePermanentError(pairs, reached=reached)
    maybe_delivered = any(
        not isinstance(exc, DeliveryError) or exc.maybe_delivered for _, exc in pairs
    )
    hints = [getattr(exc, "retry_after", None) for _, exc in pairs]
    retry_after = min((hint for hint in hints if hint is not None), default=None)
    raise HedgeTransientError(pairs, retry_after, reached=reached, maybe_delivered=maybe_delivered)
