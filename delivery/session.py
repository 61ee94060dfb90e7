"""Run batches from synchronous code on an event loop of the Session's own.

The chunks of a job share the loop, the provider connections and the limiter's client; the
loop runs only while ``deliver`` runs, so the caller's work (the ORM) never overlaps it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Iterable

from clock import Clock
from delivery.channel import Channel
from delivery.engine import Flag, close_channel, deliver
from delivery.envelope import Envelope
from delivery.gate import Gate
from delivery.limiter import RateLimiter
from delivery.limits import DeliveryLimits
from delivery.observer import Observer
from delivery.results import DeliveryResult

__all__ = ["Interrupted", "Session"]

logger = logging.getLogger("delivery")


class Interrupted(Exception):
    """The calling thread was interrupted (e.g. a soft time limit) while a batch ran.

    The batch was stopped as by a stop signal and ran to its end; ``results``
    holds its outcomes, to be recorded before ``cause`` is raised again.
    """

    def __init__(self, results: list[DeliveryResult], cause: BaseException) -> None:
        super().__init__(f"batch interrupted by {cause!r}; {len(results)} results kept")
        self.results = results
        self.cause = cause


class Session:
    """One event loop, channel and rate limiter kept for several batches run from synchronous code.

    The channel opens at the first chunk that needs it (again at the next if that fails);
    leaving the context closes it (within ``close_timeout``) and the limiter, then the loop.
    Not for use inside a running event loop, nor from two threads at once.
    """

    def __init__(
        self,
        channel_factory: Callable[[], Channel],
        *,
        clock: Clock,
        limiter_factory: Callable[[], RateLimiter] | None = None,
        close_timeout: float = 5.0,
    ) -> None:
        self._channel_factory = channel_factory
        self._limiter_factory = limiter_factory
        self._clock = clock
        self._close_timeout = close_timeout
        self._jobs: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        # Built inside the loop at the first chunk (their connections belong to it).
        self._channel: _KeptOpen | None = None
        self._limiter: RateLimiter | None = None

    def __enter__(self) -> Session:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "Session was used from inside a running event loop, which it would block; "
                "await delivery.deliver() there instead."
            )
        self._jobs = queue.SimpleQueue()
        self._stopped = threading.Event()  # set when the loop's thread ends
        # The loop has a thread of its own: the calling thread stays free to tick.
        self._thread = threading.Thread(target=self._serve, name="delivery-loop", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except BaseException:
            if exc_type is None:
                raise
            # Leaving on an exception: that one goes on; a failure to close is logged.
            logger.warning("Delivery session did not close cleanly", exc_info=True)

    def close(self) -> None:
        """Close the channel, the limiter, then the loop (idempotent).

        An exception raised into the calling thread meanwhile is raised once all is closed.
        """
        if self._thread is None:
            return
        cause: BaseException | None = None
        try:
            self._run(self._close_resources)
        except BaseException as exc:
            cause = exc  # raised into the wait: the close ran to its end all the same
        assert self._jobs is not None
        self._jobs.put(None)
        while True:
            # As in _run: an Event, which an exception raised into the wait
            # cannot leave half-updated, as it can a Thread.join.
            try:
                self._stopped.wait()
                break
            except BaseException as exc:
                cause = cause or exc
        self._thread.join()
        self._thread = None
        if cause is not None:
            raise cause

    def deliver(
        self,
        envelopes: Iterable[Envelope],
        *,
        policy: DeliveryLimits,
        stop: Flag | None = None,
        gate: Gate | None = None,
        tick: Callable[[], None] | None = None,
        tick_interval: float = 0.25,
        observer: Observer | None = None,
    ) -> list[DeliveryResult]:
        """Run one batch on the session's loop; return one result per envelope (blocking).

        The calling thread calls ``tick`` every ``tick_interval`` seconds (to refresh ``gate``);
        the batch runs in its context (context variables, such as the claim logs carry). An
        exception raised into it (a soft time limit) stops the batch as ``stop`` would, then
        ``Interrupted`` carries the results.
        """
        if self._thread is None:
            raise RuntimeError("Session.deliver() needs the session open: use 'with Session(...)'.")
        envelopes = list(envelopes)
        interrupt = threading.Event()
        stops = [flag for flag in (stop, interrupt) if flag is not None]
        # The batch's loop and stop event once it runs: the calling thread sets that event when
        # it finds a flag set (each tick, or interrupted), so the loop needs no timer to look.
        running: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

        async def batch() -> list[DeliveryResult]:
            channel, limiter = self._resources()
            async_stop = asyncio.Event()
            running.append((asyncio.get_running_loop(), async_stop))
            return await deliver(
                envelopes,
                channel,
                policy=policy,
                clock=self._clock,
                limiter=limiter,
                stop=async_stop,
                gate=gate,
                observer=observer,
                flags=stops,
            )

        def wake() -> None:
            if running and any(flag.is_set() for flag in stops):
                loop, async_stop = running[0]
                loop.call_soon_threadsafe(async_stop.set)

        return self._run(batch, stop=interrupt, tick=tick, tick_interval=tick_interval, wake=wake)

    def _resources(self) -> tuple[_KeptOpen, RateLimiter | None]:
        if self._channel is None:
            # Both or neither: a limiter that failed to build must leave no later batch unlimited.
            limiter = self._limiter_factory() if self._limiter_factory is not None else None
            channel = _KeptOpen(self._channel_factory())
            self._channel, self._limiter = channel, limiter
        return self._channel, self._limiter

    async def _close_resources(self) -> None:
        channel, self._channel = self._channel, None
        limiter, self._limiter = self._limiter, None
        try:
            if channel is not None:
                await channel.close(self._clock, self._close_timeout)
        finally:
            if limiter is not None:
                try:
                    await limiter.aclose()
                except Exception:
                    logger.warning("Rate limiter did not close cleanly", exc_info=True)

    def _run(self, job, *, stop=None, tick=None, tick_interval: float = 0.25, wake=None):
        """Hand ``job`` (a coroutine function) to the loop and wait for it, ticking.

        ``wake`` runs after each tick and after ``stop`` is set: the batch learns of new flags.
        """
        assert self._jobs is not None
        outcome: dict[str, object] = {}
        # Waiting on an Event, not on a queue or a join: an exception raised into
        # the wait by a signal handler leaves the Event's state true.
        finished = threading.Event()
        queued = False
        cause: BaseException | None = None
        while True:
            # Every statement from the hand-over to the end of the wait sits inside
            # the try: an exception raised by a signal handler can land on any of them.
            try:
                if not queued:
                    self._jobs.put((job, contextvars.copy_context(), outcome, finished))
                    queued = True
                while not finished.wait(tick_interval):
                    if tick is not None:
                        tick()
                    if wake is not None:
                        wake()
                break
            except BaseException as exc:
                if not queued:
                    raise  # nothing was handed over
                # Stop the batch, let it finish (drain and all), then report.
                if stop is not None:
                    stop.set()
                if wake is not None:
                    wake()
                cause = cause or exc
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        result = outcome["result"]
        if cause is not None:
            if result is None:  # the close: no results to hand back
                raise cause
            raise Interrupted(result, cause)  # type: ignore[arg-type]
        return result

    def _serve(self) -> None:
        assert self._jobs is not None
        try:
            with asyncio.Runner() as runner:
                while (job := self._jobs.get()) is not None:
                    coroutine_function, context, outcome, finished = job
                    try:
                        outcome["result"] = runner.run(coroutine_function(), context=context)
                    except BaseException as exc:  # handed to the calling thread
                        outcome["error"] = exc
                    finally:
                        finished.set()
        finally:
            self._stopped.set()


class _KeptOpen:
    """A channel opened once for a session: a batch's enter and exit leave it open."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.name = channel.name
        self.honours_idempotency_keys = channel.honours_idempotency_keys
        self.max_concurrency = channel.max_concurrency
        self.send = channel.send  # no forwarding coroutine between the engine and the channel
        self.is_open = False

    async def __aenter__(self) -> _KeptOpen:
        if not self.is_open:
            await self.channel.__aenter__()
            self.is_open = True
        return self

    async def __aexit__(self, *exc_info) -> None:
        return None

    async def close(self, clock: Clock, seconds: float) -> None:
        if self.is_open:
            self.is_open = False
            await close_channel(self.channel, clock, seconds)
