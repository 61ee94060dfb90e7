"""The interface the engine needs from a channel."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self

from delivery.envelope import Envelope

__all__ = ["Channel"]


class Channel(Protocol):
    """A connection to a provider, opened once per batch or per ``Session``.

    ``send`` returns the message id or raises ``TransientError``/``PermanentError``; cancelled
    at any ``await``, it leaves the channel usable. ``honours_idempotency_keys``: the provider
    dedupes by ``envelope.key``, so (only then) lost answers are retried and calls hedged.
    ``max_concurrency`` keeps calls from queueing inside the channel, where a timeout could
    not tell "never sent" from "sent".
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
