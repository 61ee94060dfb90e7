"""What the engine needs from a channel (a way of handing a message to a provider)."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from delivery.envelope import Envelope

__all__ = ["Channel"]


@runtime_checkable
class Channel(Protocol):
    """A provider connection for a batch, or for the batches of one engine session.

    ``__aenter__``/``__aexit__`` open and close connections once per batch
    (``deliver``) or once per ``Session``, which keeps the channel open
    between its batches;
    ``send`` hands over one envelope and returns the provider's message id.
    ``send`` raises ``TransientError``/``PermanentError`` (see
    ``delivery.errors``); it may be cancelled at any ``await`` (timeout, stop
    signal, losing a hedge) and must leave the channel usable when it is.

    ``honours_idempotency_keys`` promises that the provider deduplicates by
    ``envelope.key``: only then may the engine retry a call whose answer was
    lost, and only then may a call be hedged. ``max_concurrency`` caps how
    many sends the engine runs at once on this channel (None: no cap of its
    own), so that a call never queues inside the channel where a timeout
    could not tell "never sent" from "sent".
    """

    name: str
    honours_idempotency_keys: bool
    max_concurrency: int | None

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    async def send(self, envelope: Envelope) -> str: ...
