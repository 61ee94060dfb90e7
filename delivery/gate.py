"""Snapshots of which envelopes were withdrawn since they were claimed.

A call may start only under a snapshot whose read began at most ``max_age``
seconds before, so no call starts later than ``max_age`` after a withdrawal
is committed. Without a fresh snapshot, calls wait instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from clock import Clock

__all__ = ["Gate"]

WAIT_POLL_SECONDS = 0.02


class Gate:
    """Withdrawals published from any thread, read on the engine's event loop."""

    def __init__(self, *, max_age: float, clock: Clock) -> None:
        if not max_age > 0:
            raise ValueError(
                f"Gate.max_age must be a positive number of seconds (got {max_age!r})."
            )
        self.max_age = max_age
        self._clock = clock
        # Replaced whole, so another thread never sees half of each snapshot.
        self._snapshot: tuple[float, Mapping[int, str]] | None = None

    def publish(self, withdrawn: Mapping[int, str], *, taken_at: float) -> None:
        """Record ``withdrawn`` from a read that began at ``taken_at`` (monotonic).

        An older snapshot never replaces a newer one.
        """
        current = self._snapshot
        if current is not None and current[0] > taken_at:
            return
        self._snapshot = (taken_at, MappingProxyType(dict(withdrawn)))

    def withdrawn(self, reminder_id: int) -> str | None:
        """Return the withdrawal reason in the latest snapshot, fresh or not."""
        current = self._snapshot
        return None if current is None else current[1].get(reminder_id)

    def is_fresh(self) -> bool:
        current = self._snapshot
        return current is not None and self._clock.monotonic() - current[0] <= self.max_age

    async def clearance(self, reminder_id: int) -> str | None:
        """Wait for a fresh snapshot; return the withdrawal reason, or None to go ahead.

        The wait is unbounded; the caller bounds or cancels it.
        """
        while True:
            current = self._snapshot
            if current is not None and self._clock.monotonic() - current[0] <= self.max_age:
                return current[1].get(reminder_id)
            await self._clock.sleep(WAIT_POLL_SECONDS)
