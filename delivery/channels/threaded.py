"""Run a blocking send callable, one thread per call, within the engine's limits.

A thread cannot be cancelled: a call cut off may still succeed, so it is reported maybe delivered
and its late outcome only logged. One thread per call, no pool: an abandoned call never queues a
later one. The callable raises ``TransientError``/``PermanentError`` and must not touch the ORM.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Self

from delivery.envelope import Envelope
from delivery.errors import TransientError

__all__ = ["ThreadedChannel"]

logger = logging.getLogger(__name__)


class ThreadedChannel:
    """Adapt ``send(envelope) -> message id`` (blocking) to the ``Channel`` protocol."""

    honours_idempotency_keys = False
    max_concurrency = None

    def __init__(self, name: str, send: Callable[[Envelope], str]) -> None:
        self.name = name
        self._send = send
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running_threads(self) -> int:
        """Return how many send threads are running, abandoned ones included."""
        with self._lock:
            return self._running

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info) -> None:
        running = self.running_threads
        if running:
            logger.warning(
                "Channel %s closes with %d send threads still running in the background",
                self.name,
                running,
            )

    async def send(self, envelope: Envelope) -> str:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def report_late(result: str | None, error: BaseException | None) -> None:
            logger.warning(
                "Abandoned send of reminder %s via %s finished late: %s",
                envelope.reminder_id,
                self.name,
                f"error {error!r}" if error is not None else f"sent as {result}",
            )

        def settle(result: str | None, error: BaseException | None) -> None:
            if future.done():  # the call timed out or the batch was stopped
                report_late(result, error)
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(result or "")

        def run() -> None:
            result: str | None = None
            error: BaseException | None = None
            try:
                result = self._send(envelope)
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            finally:
                with self._lock:
                    self._running -= 1
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the batch's event loop is closed
                report_late(result, error)

        with self._lock:
            self._running += 1
        thread = threading.Thread(
            target=run, name=f"delivery-{self.name}-{envelope.reminder_id}", daemon=False
        )
        try:
            thread.start()
        except BaseException as exc:
            with self._lock:
                self._running -= 1
            if isinstance(exc, RuntimeError):  # no thread to be had: nothing was sent
                raise TransientError(f"no thread to send in ({exc})", reached=False) from exc
            raise
        return await future
