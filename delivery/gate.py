"""The caller's word, kept fresh, on which envelopes may still be sent.

A batch can run for minutes; meanwhile staff may cancel a workshop or an
enrollment, or move a workshop so that a rendered message carries the wrong
time. The caller (which owns the database) re-reads that state in its own
thread and publishes a snapshot here: the envelopes withdrawn since they were
claimed, each with a reason. The engine asks the gate right before every
provider call.

The promise is about time: a call may start only under a snapshot whose read
began at most ``max_age`` seconds before (on the monotonic clock). A read
sees every change committed before it began, so no call starts later than
``max_age`` after a change is committed. When no fresh snapshot is at hand
(the caller's reads fail or lag), calls wait for one instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from clock import Clock

__all__ = ["Gate"]

# How often a call waiting for a fresh snapshot looks again.
WAIT_POLL_SECONDS = 0.02


class Gate:
    """Withdrawals published from any thread; read by the engine inside its event loop."""

    def __init__(self, *, max_age: float, clock: Clock) -> None:
        if not max_age > 0:
            raise ValueError(
                f"Gate.max_age must be a positive number of seconds (got {max_age!r})."
            )
        self.max_age = max_age
        self._clock = clock
        # One tuple, replaced whole: a reader in another thread sees the old
        # snapshot or the new one, never half of each.
        self._snapshot: tuple[float, Mapping[int, str]] | None = None

    def publish(self, withdrawn: Mapping[int, str], *, taken_at: float) -> None:
        """Record which envelopes may no longer be sent, as read from ``taken_at`` (monotonic).

        ``taken_at`` is when the read *began*: anything committed before it
        is in ``withdrawn``. An older snapshot never replaces a newer one.
        """
        current = self._snapshot
        if current is not None and current[0] > taken_at:
            return
        self._snapshot = (taken_at, MappingProxyType(dict(withdrawn)))

    def withdrawn(self, reminder_id: int) -> str | None:
        """Return why the envelope was withdrawn in the latest snapshot, fresh or not."""
        current = self._snapshot
        return None if current is None else current[1].get(reminder_id)

    def is_fresh(self) -> bool:
        current = self._snapshot
        return current is not None and self._clock.monotonic() - current[0] <= self.max_age

    async def clearance(self, reminder_id: int) -> str | None:
        """Wait for a fresh snapshot; return why the envelope is withdrawn, or None to go ahead.

        Waits as long as no fresh snapshot arrives: the caller bounds the
        wait (by the envelope's deadline) and may cancel it.
        """
        while True:
            current = self._snapshot
            if current is not None and self._clock.monotonic() - current[0] <= self.max_age:
                return current[1].get(reminder_id)
            await self._clock.sleep(WAIT_POLL_SECONDS)
