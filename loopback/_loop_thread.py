"""Run an asyncio server on its own event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

# Starting or stopping a loopback server never takes this long unless broken.
CONTROL_TIMEOUT = 10.0


class LoopThread:
    """One event loop in one daemon thread; coroutines are submitted to it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} is already running; stop() it first.")
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(CONTROL_TIMEOUT):
            raise RuntimeError(f"{self._name} did not start its event loop")

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the loop and return its result (blocking this thread)."""
        if self._loop is None:
            raise RuntimeError(f"{self._name} is not running; call start() first.")

        async def wrapper() -> T:
            return await make()

        future: Future[T] = asyncio.run_coroutine_threadsafe(wrapper(), self._loop)
        return future.result(CONTROL_TIMEOUT)

    def call(self, function: Callable[[], T]) -> T:
        """Call ``function`` on the loop's thread and return its result."""

        async def call() -> T:
            return function()

        return self.run(call)

    def stop(self) -> None:
        """Cancel every task left on the loop, stop it and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(cancel_all)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CONTROL_TIMEOUT)
            loop.close()
            self._loop = None
            self._thread = None
