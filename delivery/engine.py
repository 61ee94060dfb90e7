"""Fan envelopes out to a channel within limits, and return one result per envelope.

Every task lives in a ``TaskGroup`` and is awaited before ``deliver`` returns::

    deliver
    └── TaskGroup
        ├── watch   waits for the stop signal or the budget; raises _Stopped
        └── feed    starts one task per envelope when a concurrency slot frees
            └── TaskGroup
                └── send:<reminder id>  slot -> deadline check -> rate limiter -> call
                                        -> classify -> (backoff without the slot) -> ...

A stop cancels ``feed``: cancellation reaches each envelope wherever it waits, the channel's
cleanup runs, and each envelope records how far it got. Envelopes never handed to a task end
``CANCELLED`` with ``provider_reached=False``.
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from clock import Clock
from delivery.addresses import address_problem
from delivery.channel import Channel
from delivery.envelope import Envelope
from delivery.errors import DeliveryError, RateLimitedError, TransientError
from delivery.gate import Gate, current_call
from delivery.limiter import DeadlineReached, RateLimiter
from delivery.limits import DeliveryLimits
from delivery.observer import (
    CALL_MAYBE_DELIVERED,
    CALL_PERMANENT,
    CALL_SENT,
    CALL_THROTTLED,
    CALL_TIMEOUT,
    CALL_TRANSIENT,
    Observer,
)
from delivery.results import DeliveryResult, Outcome

__all__ = ["close_channel", "deliver"]

logger = logging.getLogger("delivery")

# The longest a provider's 429 pauses every sender: the pause is shared and outlives a restart,
# and a Retry-After of a year (a provider's bug) would stop every worker for it.
MAX_PAUSE = 300.0


class Flag(Protocol):
    """A stop flag set by another thread or process (a threading or multiprocessing ``Event``)."""

    def is_set(self) -> bool: ...


class _Stopped(Exception):
    """Raised by ``_watch`` to end the batch's task group."""


@dataclass(slots=True, frozen=True)
class _Failure:
    outcome: Outcome
    error: str
    ambiguous: bool = False
    retry_after: float | None = None
    rate_limited: bool = False

    @property
    def call_outcome(self) -> str:
        """Name how the failed call ended, for an observer."""
        if self.rate_limited:
            return CALL_THROTTLED
        if self.outcome is Outcome.PERMANENT:
            return CALL_PERMANENT
        return CALL_MAYBE_DELIVERED if self.ambiguous else CALL_TRANSIENT


@dataclass(slots=True)
class _Progress:
    envelope: Envelope
    attempts: int = 0
    reached: bool = False
    maybe_delivered: bool = False
    in_flight: bool = False
    last_failure: _Failure | None = None
    result: DeliveryResult | None = None

    def finish(self, outcome: Outcome, error: str = "", message_id: str | None = None) -> None:
        self.result = DeliveryResult(
            reminder_id=self.envelope.reminder_id,
            key=self.envelope.key,
            outcome=outcome,
            message_id=message_id,
            error=error,
            attempts=self.attempts,
            provider_reached=self.reached,
            maybe_delivered=self.maybe_delivered,
        )


class _Batch:
    def __init__(
        self,
        envelopes: list[Envelope],
        channel: Channel,
        *,
        policy: DeliveryLimits,
        clock: Clock,
        limiter: RateLimiter | None,
        random: Callable[[], float],
        gate: Gate | None,
        observer: Observer | None,
        stop: asyncio.Event,
        flags: tuple[Flag, ...],
    ) -> None:
        self._progress = [_Progress(envelope) for envelope in envelopes]
        self._stop = stop
        # The caller's stop flags, read before every call start: none starts once one is set.
        self._flags = flags
        self._observer = observer
        self._observer_failed = False
        self._channel = channel
        self._policy = policy
        self._clock = clock
        self._limiter = limiter
        self._gate = gate
        self._random = random
        self._name = channel.name
        self._concurrency = min(policy.concurrency, channel.max_concurrency or policy.concurrency)
        self._stop_reason = "the batch was cancelled"
        self._started_at = clock.monotonic()
        # Set when the budget is used up and in-flight calls may still finish.
        self._draining = False
        self._calls_in_flight = 0
        self._no_calls: asyncio.Event | None = None

    # -- the batch ---------------------------------------------------------------

    async def run(self) -> list[DeliveryResult]:
        todo = self._preflight()
        if self._stop.is_set() or any(flag.is_set() for flag in self._flags):
            self._stop_reason = "stop signal"
        elif todo:
            await self._with_channel(todo)
        for progress in self._progress:
            if progress.result is None:  # never handed to a task
                progress.finish(
                    Outcome.CANCELLED, f"stopped ({self._stop_reason}) before the first attempt"
                )
        results = [progress.result for progress in self._progress]
        assert all(result is not None for result in results)
        return results  # type: ignore[return-value]

    def _preflight(self) -> list[_Progress]:
        """Resolve what needs no provider: bad input, duplicates, deadlines already past."""
        seen_ids: set[int] = set()
        seen_keys: dict[str, int] = {}
        todo = []
        now = self._clock.now()
        for progress in self._progress:
            envelope = progress.envelope
            if envelope.reminder_id in seen_ids:
                raise ValueError(
                    f"reminder {envelope.reminder_id} appears twice in one batch; pass each "
                    "reminder once so every result maps to one row."
                )
            seen_ids.add(envelope.reminder_id)
            if envelope.key in seen_keys:
                progress.finish(
                    Outcome.PERMANENT,
                    f"duplicate key in batch: reminder {seen_keys[envelope.key]} carries the same "
                    "key and is the one delivered",
                )
                continue
            seen_keys[envelope.key] = envelope.reminder_id
            problem = address_problem(envelope.recipient)
            if problem is not None:
                progress.finish(Outcome.PERMANENT, problem)
            elif now >= envelope.stop_at:
                progress.finish(Outcome.EXPIRED, self._deadline_text(envelope))
            else:
                todo.append(progress)
        return todo

    async def _with_channel(self, todo: list[_Progress]) -> None:
        try:
            await self._channel.__aenter__()
        except Exception as exc:
            logger.exception("Channel %s could not be opened", self._name)
            for progress in todo:
                progress.finish(
                    Outcome.TRANSIENT, f"channel {self._name!r} could not be opened: {exc!r}"
                )
            return
        try:
            await self._fan_out(todo)
        except BaseException as exc:
            await close_channel(self._channel, self._clock, self._policy.close_timeout, exc)
            raise
        await close_channel(self._channel, self._clock, self._policy.close_timeout)

    async def _fan_out(self, todo: list[_Progress]) -> None:
        slots = asyncio.Semaphore(self._concurrency)
        try:
            async with asyncio.TaskGroup() as group:
                watcher = group.create_task(self._watch(), name="delivery.watch")
                group.create_task(self._feed(todo, slots, watcher), name="delivery.feed")
        except* _Stopped:
            logger.warning("Delivery batch on %s stopped: %s", self._name, self._stop_reason)

    async def _watch(self) -> None:
        left = self._policy.budget - (self._clock.monotonic() - self._started_at)
        try:
            async with self._clock.timeout(max(left, 0.0)):
                await self._stop.wait()
        except TimeoutError:
            self._stop_reason = f"budget of {self._policy.budget:g}s used up"
            await self._drain(abort=self._stop)
        else:
            # A stop (warm shutdown) acts as the budget: no new call, calls in flight get the drain.
            self._stop_reason = "stop signal"
            await self._drain(abort=None)
        raise _Stopped(self._stop_reason)

    def _stopping(self) -> bool:
        """Return whether no new call may start: draining, or a caller's flag now set.

        A flag found set stops the batch at once (``_watch`` drains), not when the caller relays it.
        """
        if not self._draining and any(flag.is_set() for flag in self._flags):
            self._draining = True
            self._stop.set()
        return self._draining

    async def _drain(self, abort: asyncio.Event | None) -> None:
        """Start no new call; give calls in flight up to ``policy.drain`` to end.

        A call ending here has a known outcome; one cut off by the stop after may have reached
        the provider. ``abort`` (the stop signal, when the budget began the drain) ends it early.
        """
        self._draining = True
        if self._policy.drain <= 0 or self._calls_in_flight == 0:
            return
        self._no_calls = asyncio.Event()
        waiters = [asyncio.ensure_future(self._no_calls.wait())]
        if abort is not None:
            waiters.append(asyncio.ensure_future(abort.wait()))
        try:
            async with self._clock.timeout(self._policy.drain):
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            pass
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _feed(
        self, todo: list[_Progress], slots: asyncio.Semaphore, watcher: asyncio.Task
    ) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for progress in todo:
                    await slots.acquire()
                    # The slot is handed over to the task, which releases it.
                    group.create_task(
                        self._deliver_one(progress, slots),
                        name=f"delivery.send:{progress.envelope.reminder_id}",
                    )
        finally:
            watcher.cancel()

    # -- one envelope ------------------------------------------------------------

    async def _deliver_one(self, progress: _Progress, slots: asyncio.Semaphore) -> None:
        holding = True
        envelope = progress.envelope
        try:
            tries = 0
            while True:
                if not holding:
                    await slots.acquire()
                    holding = True
                if self._clock.now() >= envelope.stop_at:
                    self._finish_at_deadline(progress)
                    return
                if self._stopping():
                    self._finish_cancelled(progress)
                    return
                failure = await self._try_once(progress)
                tries += 1
                if failure is None:
                    return
                progress.last_failure = failure
                if failure.outcome is Outcome.PERMANENT:
                    progress.finish(failure.outcome, failure.error)
                    return
                if failure.ambiguous and not self._channel.honours_idempotency_keys:
                    progress.finish(
                        failure.outcome,
                        f"{failure.error}; not retried: the provider may have accepted it and "
                        f"channel {self._name!r} does not honour idempotency keys",
                    )
                    return
                if tries >= self._policy.max_attempts:
                    progress.finish(
                        failure.outcome,
                        f"gave up after {tries} tries (max_attempts={self._policy.max_attempts}); "
                        f"last error: {failure.error}",
                    )
                    return
                delay = self._policy.backoff(
                    tries, draw=self._random(), retry_after=failure.retry_after
                )
                if delay >= self._seconds_left(envelope):  # in seconds: no date overflows
                    progress.finish(
                        failure.outcome,
                        f"{failure.error}; not retried: the next try (in {delay:.3g}s) would "
                        "start at or after the deadline",
                    )
                    return
                # Back off without the slot (a call in flight): a few greylisted or throttled
                # recipients (SMTP 451, Retry-After of minutes) would otherwise idle the batch.
                # Provider-wide trouble is slowed by the limiter pause and the attempt cap.
                slots.release()
                holding = False
                await self._clock.sleep(delay)
        except asyncio.CancelledError:
            self._finish_cancelled(progress)
            raise
        except Exception as exc:  # a bug in this module; keep the batch alive
            logger.exception("Delivery engine failed on reminder %s", envelope.reminder_id)
            progress.finish(Outcome.PERMANENT, f"internal error in the delivery engine: {exc!r}")
        finally:
            if holding:
                slots.release()
            self._log_result(progress)

    async def _try_once(self, progress: _Progress) -> _Failure | None:
        """Try once (limiter, gate, call); return the failure, or None if the envelope is done."""
        envelope = progress.envelope
        if self._gate is not None and self._withdraw(
            progress, self._gate.withdrawn(envelope.reminder_id)
        ):
            return None  # withdrawn already: spend no limiter grant on it
        if self._limiter is not None:
            waiting_since = self._clock.monotonic()
            try:
                await self._limiter.acquire(deadline_at=envelope.stop_at)
            except DeadlineReached:
                self._finish_at_deadline(progress)
                return None
            except Exception as exc:
                logger.warning(
                    "Rate limiter failed for reminder %s: %r",
                    envelope.reminder_id,
                    exc,
                    extra={"reminder_id": envelope.reminder_id, "key": envelope.key},
                )
                return _Failure(Outcome.TRANSIENT, f"rate limiter unavailable: {exc!r}")
            finally:
                if self._observer is not None:
                    self._observe("limiter_waited", self._clock.monotonic() - waiting_since)
        if self._stopping():  # the budget ran out, or a stop came, while this one waited
            self._finish_cancelled(progress)
            return None
        if self._gate is not None:
            try:
                async with self._clock.timeout(self._seconds_left(envelope)):
                    reason = await self._gate.clearance(envelope.reminder_id)
            except TimeoutError:
                self._finish_at_deadline(progress)
                return None
            if self._withdraw(progress, reason):
                return None
            if self._stopping():
                self._finish_cancelled(progress)
                return None
        # No call runs past the deadline: its timeout is clamped to what is left.
        left = self._seconds_left(envelope)
        timeout = min(self._policy.call_timeout, left)
        if timeout <= 0:
            self._finish_at_deadline(progress)
            return None
        if left < self._policy.min_call_window:
            # Too little time for a call that could not be repeated: not sent, and known.
            self._finish_at_deadline(progress, left=left)
            return None
        progress.attempts += 1
        progress.in_flight = True
        failure: _Failure | None = None
        message_id = ""
        self._calls_in_flight += 1
        call_started = self._clock.monotonic()
        call_outcome = CALL_MAYBE_DELIVERED  # what a call cut off by a stop counts as
        call = current_call.set((self._gate, envelope.reminder_id)) if self._gate else None
        try:
            async with self._clock.timeout(timeout):
                try:
                    message_id = await self._channel.send(envelope)
                    call_outcome = CALL_SENT
                except Exception as exc:  # the channel's own errors, incl. its own TimeoutError
                    failure = self._classify(progress, exc)
                    call_outcome = failure.call_outcome
        except TimeoutError:
            call_outcome = CALL_TIMEOUT
            progress.reached = True
            progress.maybe_delivered = True
            if timeout < self._policy.call_timeout:
                text = f"provider call cut off at the deadline, after {timeout:.3g}s"
            else:
                text = f"provider call exceeded call_timeout={self._policy.call_timeout:g}s"
            failure = _Failure(Outcome.TIMED_OUT, text, ambiguous=True)
        finally:
            if call is not None:
                current_call.reset(call)
            self._calls_in_flight -= 1
            if self._calls_in_flight == 0 and self._no_calls is not None:
                self._no_calls.set()
            if self._observer is not None:
                seconds = self._clock.monotonic() - call_started
                self._observe("call_ended", self._name, call_outcome, seconds, envelope.kind)
                if call_outcome == CALL_SENT:
                    self._observe("sent", self._name, self._seconds_left(envelope), envelope.kind)
        # Not in a finally: a cancellation must still see the call as in flight.
        progress.in_flight = False
        if failure is None:
            progress.reached = True
            progress.maybe_delivered = True
            progress.finish(Outcome.SENT, message_id=message_id or None)
            return None
        # Stored before the pause: a stop landing in it still quotes this failure.
        progress.last_failure = failure
        if failure.rate_limited and self._limiter is not None:
            await self._pause_limiter(failure.retry_after)
        return failure

    def _classify(self, progress: _Progress, exc: Exception) -> _Failure:
        if isinstance(exc, DeliveryError):
            progress.reached |= exc.reached
            progress.maybe_delivered |= exc.maybe_delivered
            if isinstance(exc, TransientError):
                return _Failure(
                    Outcome.TRANSIENT,
                    str(exc),
                    ambiguous=exc.maybe_delivered,
                    retry_after=exc.retry_after,
                    rate_limited=isinstance(exc, RateLimitedError),
                )
            return _Failure(Outcome.PERMANENT, str(exc))
        progress.reached = True
        progress.maybe_delivered = True
        if isinstance(exc, OSError):
            # Network trouble the channel did not translate: maybe sent, so retried only with keys.
            return _Failure(
                Outcome.TRANSIENT,
                f"{type(exc).__name__} from channel {self._name!r}: {exc}",
                ambiguous=True,
            )
        # Anything else is a bug in the channel; another try would repeat it.
        logger.error(
            "Channel %s raised %s for reminder %s",
            self._name,
            type(exc).__name__,
            progress.envelope.reminder_id,
            exc_info=exc,
            extra={"reminder_id": progress.envelope.reminder_id, "key": progress.envelope.key},
        )
        return _Failure(
            Outcome.PERMANENT, f"unexpected {type(exc).__name__} from channel {self._name!r}: {exc}"
        )

    async def _pause_limiter(self, retry_after: float | None) -> None:
        """Slow every caller of the limiter down after the provider's 429."""
        assert self._limiter is not None
        if retry_after is None:
            retry_after = self._limiter.window
        try:
            await self._limiter.pause(min(retry_after, MAX_PAUSE))
        except Exception:
            logger.warning("Could not pause the rate limiter", exc_info=True)

    def _observe(self, event: str, *args) -> None:
        """Hand a measurement to the observer; its failure is logged once and changes nothing."""
        try:
            getattr(self._observer, event)(*args)
        except Exception:
            if not self._observer_failed:
                self._observer_failed = True
                logger.warning("Delivery observer failed on %s", event, exc_info=True)

    def _seconds_left(self, envelope: Envelope) -> float:
        return (envelope.stop_at - self._clock.now()).total_seconds()

    def _withdraw(self, progress: _Progress, reason: str | None) -> bool:
        if reason is None:
            return False
        progress.finish(Outcome.WITHDRAWN, f"withdrawn before the call: {reason}")
        return True

    # -- endings -----------------------------------------------------------------

    def _deadline_text(self, envelope: Envelope) -> str:
        return f"deadline {envelope.stop_at.isoformat()} reached before the call could start"

    def _finish_at_deadline(self, progress: _Progress, *, left: float | None = None) -> None:
        """Finish an envelope whose deadline came, or is closer than min_call_window (``left``)."""
        last = progress.last_failure
        if progress.attempts == 0:
            text = self._deadline_text(progress.envelope)
            if left is not None:
                text = (
                    f"not started with {left:.3g}s left before the deadline "
                    f"{progress.envelope.stop_at.isoformat()}: under min_call_window="
                    f"{self._policy.min_call_window:g}s: a call cut off at the deadline "
                    "could not be repeated"
                )
            if last is not None:
                text += f"; last error: {last.error}"
            progress.finish(Outcome.EXPIRED, text)
            return
        assert last is not None
        progress.finish(
            last.outcome,
            f"deadline reached after {progress.attempts} attempts; last error: {last.error}",
        )

    def _finish_cancelled(self, progress: _Progress) -> None:
        reason = self._stop_reason
        if progress.in_flight:
            progress.reached = True
            progress.maybe_delivered = True
            text = f"stopped ({reason}) while call {progress.attempts} was in flight"
        elif progress.attempts:
            # A call that ended stored its failure before any further await.
            assert progress.last_failure is not None
            text = (
                f"stopped ({reason}) after {progress.attempts} attempts; "
                f"last error: {progress.last_failure.error}"
            )
        else:
            text = f"stopped ({reason}) before the first attempt"
        progress.finish(Outcome.CANCELLED, text)

    def _log_result(self, progress: _Progress) -> None:
        result = progress.result
        if result is None:
            return
        fields = {"reminder_id": result.reminder_id, "key": result.key}
        if result.outcome is Outcome.SENT:
            # DEBUG: attempt rows record every send; a line each cost 4 % of a worker's CPU.
            logger.debug(
                "Sent reminder %s via %s as %s after %d attempts",
                result.reminder_id,
                self._name,
                result.message_id,
                result.attempts,
                extra=fields,
            )
        else:
            logger.warning(
                "Reminder %s not sent via %s (%s): %s",
                result.reminder_id,
                self._name,
                result.outcome,
                _without_person(result.error, progress.envelope),
                extra=fields,
            )


_ADDRESS = re.compile(r"<?[^\s<>\"'(),;:]+@[^\s<>\"'(),;:]+>?")


def _without_person(text: str, envelope: Envelope) -> str:
    """Return ``text`` for a log line: any address, and the recipient's name, replaced."""
    text = _ADDRESS.sub("<address>", text)
    name = envelope.recipient_name.strip()
    return text.replace(name, "<name>") if len(name) > 1 else text


async def close_channel(
    channel: Channel, clock: Clock, seconds: float, exc: BaseException | None = None
) -> None:
    """Close ``channel`` within ``seconds``; results are decided, so a failure is only logged."""
    exc_info = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
    try:
        async with clock.timeout(seconds):
            await channel.__aexit__(*exc_info)
    except Exception:
        logger.warning("Channel %s did not close cleanly", channel.name, exc_info=True)


async def deliver(
    envelopes: Iterable[Envelope],
    channel: Channel,
    *,
    policy: DeliveryLimits,
    clock: Clock,
    limiter: RateLimiter | None = None,
    stop: asyncio.Event | None = None,
    random: Callable[[], float] = _random.random,
    gate: Gate | None = None,
    observer: Observer | None = None,
    flags: Iterable[Flag] = (),
) -> list[DeliveryResult]:
    """Deliver ``envelopes`` through ``channel``; return one result each, in order.

    At most ``policy.concurrency`` calls run at once, started no faster than ``limiter`` allows;
    transient failures are retried with backoff until ``policy.max_attempts``. No call starts at
    or runs past an envelope's deadline, nor (with a ``gate``) for a withdrawn envelope or under
    a stale snapshot. ``stop``, a set flag (read at each call start) or the spent
    ``policy.budget`` starts no new call and gives calls in flight ``policy.drain`` to end. Only
    a batch that cannot run at all (the same reminder twice) raises.
    """
    batch = _Batch(
        list(envelopes),
        channel,
        policy=policy,
        clock=clock,
        limiter=limiter,
        random=random,
        gate=gate,
        observer=observer,
        stop=stop if stop is not None else asyncio.Event(),
        flags=tuple(flags),
    )
    return await batch.run()
