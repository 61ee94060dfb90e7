"""A scriptable in-memory channel for tests.

With ``honours_idempotency_keys`` a repeated key returns its first message id.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from clock import Clock
from delivery.envelope import Envelope

__all__ = ["MemoryChannel", "MemoryCall"]


@dataclass(slots=True)
class MemoryCall:
    """One ``send`` as the channel saw it, timed on the monotonic clock."""

    key: str
    reminder_id: int
    started_at: float
    ended_at: float | None = None
    #: "sent", "failed: <error>", "cancelled", or None while in flight.
    outcome: str | None = None


class MemoryChannel:
    """Record sends in memory; fail, slow down or hang chosen keys on request."""

    def __init__(
        self,
        *,
        clock: Clock,
        name: str = "memory",
        honours_idempotency_keys: bool = True,
        delay: float = 0.0,
        max_concurrency: int | None = None,
    ) -> None:
        self.name = name
        self.honours_idempotency_keys = honours_idempotency_keys
        self.max_concurrency = max_concurrency
        self._clock = clock
        self._delay = delay
        self._failures: dict[str, deque[BaseException]] = defaultdict(deque)
        self._delays: dict[str, deque[float]] = defaultdict(deque)
        self._hangs: dict[str, asyncio.Event] = {}
        self.calls: list[MemoryCall] = []
        self.accepted: dict[str, str] = {}
        self.messages: list[Envelope] = []
        self.duplicates = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.opened = 0
        self.closed = 0
        self._ids = 0

    def fail(self, key: str, *errors: BaseException) -> None:
        """Make the next calls for ``key`` raise ``errors`` in order, then succeed."""
        self._failures[key].extend(errors)

    def slow(self, key: str, *seconds: float) -> None:
        """Make the next calls for ``key`` take ``seconds``, in order."""
        self._delays[key].extend(seconds)

    def hang(self, key: str) -> None:
        """Make calls for ``key`` wait until ``release(key)`` (or cancellation)."""
        self._hangs[key] = asyncio.Event()

    def release(self, key: str) -> None:
        """Let hanging calls for ``key`` go on."""
        self._hangs.pop(key).set()

    def calls_for(self, key: str) -> list[MemoryCall]:
        """Return the calls made for ``key``, in start order."""
        return [call for call in self.calls if call.key == key]

    @property
    def start_times(self) -> list[float]:
        """Return the start time of every call, in order."""
        return [call.started_at for call in self.calls]

    async def __aenter__(self) -> Self:
        self.opened += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.closed += 1
        return None

    async def send(self, envelope: Envelope) -> str:
        call = MemoryCall(envelope.key, envelope.reminder_id, self._clock.monotonic())
        self.calls.append(call)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            delays = self._delays.get(envelope.key)
            delay = delays.popleft() if delays else self._delay
            if delay > 0:
                await self._clock.sleep(delay)
            hang = self._hangs.get(envelope.key)
            if hang is not None:
                await hang.wait()
            queued = self._failures.get(envelope.key)
            if queued:
                error = queued.popleft()
                call.outcome = f"failed: {error}"
                raise error
            message_id = self._accept(envelope)
            call.outcome = "sent"
            return message_id
        except asyncio.CancelledError:
            call.outcome = "cancelled"
            raise
        finally:
            self.in_flight -= 1
            call.ended_at = self._clock.monotonic()

    def _accept(self, envelope: Envelope) -> str:
        if self.honours_idempotency_keys and envelope.key in self.accepted:
            self.duplicates += 1
            return self.accepted[envelope.key]
        if envelope.key in self.accepted:
            self.duplicates += 1
        self._ids += 1
        message_id = f"{self.name}-{self._ids}"
        self.accepted.setdefault(envelope.key, message_id)
        self.messages.append(envelope)
        return message_id
