"""Snapshots of which envelopes were withdrawn since they were claimed.

A call starts only under a snapshot whose read began at most ``max_age`` seconds before, so
none starts over ``max_age`` after a withdrawal commits; without a fresh one, calls wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType

from clock import Clock
from delivery.errors import TransientError

__all__ = ["Gate", "last_look"]

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
        """Keep ``withdrawn`` (read begun at ``taken_at``, monotonic) unless a newer one is held."""
        current = self._snapshot
        if current is not None and current[0] > taken_at:
            return
        self._snapshot = (taken_at, MappingProxyType(dict(withdrawn)))

    def withdrawn(self, reminder_id: int) -> str | None:
        """Return the withdrawal reason in the latest snapshot, fresh or not."""
        current = self._snapshot
        return None if current is None else current[1].get(reminder_id)

    def _fresh(self) -> Mapping[int, str] | None:
        """Return the withdrawals of a snapshot read under ``max_age`` ago, or None."""
        current = self._snapshot
        if current is not None and self._clock.monotonic() - current[0] <= self.max_age:
            return current[1]
        return None

    async def clearance(self, reminder_id: int) -> str | None:
        """Wait (unbounded) for a fresh snapshot; return the withdrawal reason, or None to go."""
        while (withdrawn := self._fresh()) is None:
            await self._clock.sleep(WAIT_POLL_SECONDS)
        return withdrawn.get(reminder_id)


# The gate and reminder of the call the engine is making (set around Channel.send).
current_call: ContextVar[tuple[Gate, int] | None] = ContextVar("delivery_call", default=None)


def last_look() -> None:
    """Refuse the current call if its snapshot went stale or withdrew it since the engine's check.

    A channel calls it just before the first byte, after whatever it awaited since the engine's
    check (opening a connection): a process paused in between (a VM pause, SIGSTOP) must not
    wake and send under the old snapshot. The refusal is transient and nothing reached the
    provider, so the next try waits for a fresh snapshot.
    """
    call = current_call.get()
    if call is None:
        return
    gate, reminder_id = call
    withdrawn = gate._fresh()
    if withdrawn is None or reminder_id in withdrawn:
        raise TransientError(
            "paused between the check of its claim and the call: not sent", reached=False
        )
