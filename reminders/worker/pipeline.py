"""Compose the services into the two jobs the workers run: the scan and a delivery batch.

Both are synchronous and own no state: each decision is a guarded UPDATE in reminders.services,
so a scan or batch may run twice, overlap another or die at any line without sending twice.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import NoReturn

import psycopg
from django.conf import settings
from django.db import Error, InterfaceError, OperationalError, connection

from clock import Clock, default_clock
from delivery.results import DeliveryResult, Outcome
from delivery.session import Interrupted
from reminders import queue
from reminders.content import reminder_envelope
from reminders.locks import gave_up_waiting, read_only
from reminders.services import (
    dispatches_prune,
    reminder_claim_batch,
    reminder_record_batch,
    reminder_release,
    reminder_release_interrupted,
    reminders_dispatch,
    reminders_plan,
    reminders_reap,
    reminders_settle,
    reminders_unpublished,
    replays_resume,
    scan_completed,
    sessions_prune,
)
from reminders.services.feedback import delivery_events_prune, suppression_addresses
from reminders.services.notices import (
    notices_dispatch,
    notices_plan,
    notices_revise,
    notices_settle,
)
from reminders.services.watch import ClaimWatch
from reminders.worker import bridge
from reminders.worker.logcontext import claim_context

logger = logging.getLogger(__name__)


class DatabaseUnavailable(Exception):
    """The database could not be reached before ``ids`` were claimed; nothing was sent.

    ``held`` is ``(token, chunk)`` of a claim that may have committed: the retry releases it.
    """

    def __init__(self, ids: list[int], held: tuple[uuid.UUID, list[int]] | None = None) -> None:
        super().__init__(f"database unavailable before claiming {len(ids)} reminders")
        self.ids = ids
        self.held = held


def _notices(*, clock: Clock, publish) -> dict[str, int]:
    """Revise, settle, plan and dispatch change notices (reminders.services.notices)."""
    counts = {"revisions": notices_revise(clock=clock)}
    counts.update(notices_settle(clock=clock))
    counts["notices_planned"] = notices_plan(clock=clock)
    counts["notices_dispatched"] = notices_dispatch(clock=clock, publish=publish)
    return {name: value for name, value in counts.items() if value}


def scan(
    *, clock: Clock | None = None, publish=None, worker: str = "", notices_publish=None
) -> dict[str, int]:
    """Settle, reap, plan and dispatch reminders and notices, then record a ScanRun."""
    clock = clock or default_clock()
    started = clock.monotonic()
    phases: dict[str, float] = {}
    _bound_statements()
    skipped: dict[str, int] = {}

    def timed(phase: str, job, default):
        begun = clock.monotonic()
        try:
            return job()
        except OperationalError as exc:
            # A phase that waited too long for a lock (a long staff transaction) or ran past
            # REMINDERS_SCAN_STATEMENT_TIMEOUT is left to the next scan; the others still run.
            if not gave_up_waiting(exc):
                raise
            logger.warning("Scan phase %s gave up (%s); the next scan runs it", phase, exc)
            skipped[f"{phase}_skipped"] = 1
            return default
        finally:
            phases[phase] = round(clock.monotonic() - begun, 3)

    counts: dict[str, int] = timed(
        "settle",
        lambda: reminders_settle(clock=clock),
        {"cancelled": 0, "missed": 0, "reopened": 0},
    )
    reaped = timed("reap", lambda: reminders_reap(clock=clock), {})
    counts.update({f"reaped_{key}": value for key, value in reaped.items()})
    counts["planned"] = timed("plan", lambda: reminders_plan(clock=clock), 0)
    counts["dispatched"] = timed(
        "dispatch", lambda: reminders_dispatch(clock=clock, publish=publish), 0
    )
    # Change notices: after the reminders' own phases, so a reminder claimed in this
    # scan's dispatch is not yet told anything the notices would compare.
    noticed = timed(
        "notices",
        lambda: _notices(clock=clock, publish=notices_publish or queue.publish_notices),
        {},
    )
    counts.update(noticed)
    timed(
        "prune",
        lambda: (
            dispatches_prune(clock=clock)
            + delivery_events_prune(clock=clock)
            + sessions_prune(clock=clock)
        ),
        0,
    )
    resumed = timed("resume", lambda: replays_resume(clock=clock, publish=queue.publish_replay), 0)
    if resumed:
        counts["replays_resumed"] = resumed
    counts.update(skipped)
    scan_completed(
        counts=counts,
        duration=clock.monotonic() - started,
        phase_seconds=phases,
        worker=worker,
        clock=clock,
    )
    logger.info("Scan finished: %s", counts)
    return counts


def _bound_statements() -> None:
    """Give this session's statements REMINDERS_SCAN_STATEMENT_TIMEOUT (PostgreSQL)."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return
    milliseconds = round(settings.REMINDERS_SCAN_STATEMENT_TIMEOUT * 1000)
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('statement_timeout', %s, false)", [f"{milliseconds}ms"])


def deliver(
    ids: list[int],
    *,
    clock: Clock | None = None,
    channel: str | None = None,
    worker: str = "",
    stop=None,
    held: tuple[uuid.UUID, list[int]] | None = None,
) -> dict[str, int]:
    """Claim, render, send and record ``ids``, one concurrency-sized chunk at a time.

    A worker killed mid-batch leaves at most a chunk ``sending`` for the reaper. ``stop`` (the
    shutdown flag) ends the batch; unclaimed ids are due at the next scan. ``held`` is a
    ``DatabaseUnavailable``'s: that claim is released first.
    """
    clock = clock or default_clock()
    channel = channel or settings.REMINDERS_CHANNEL
    if held is not None:
        token, chunk = held
        try:
            released = reminder_release_interrupted(
                token=token, channel=channel, ids=chunk, clock=clock
            )
        except Error as exc:
            if not database_away(exc):
                raise
            connection.close()
            raise DatabaseUnavailable(ids, held=held) from exc
        if released:
            logger.warning(
                "Handed back %s reminders a claim cut off from the database held", released
            )
    # A chunk is what can really be in flight at once.
    chunk_size = bridge.check_channel(channel, clock=clock)
    # Read once, so each chunk's claim checks suppressions in its own statement.
    try:
        addresses = suppression_addresses(ids) if len(ids) > chunk_size else None
    except (OperationalError, InterfaceError) as exc:
        connection.close()
        raise DatabaseUnavailable(ids) from exc
    started = clock.monotonic()
    budget = float(settings.REMINDERS_BATCH_BUDGET)
    counts: Counter[str] = Counter()
    try:
        # One loop, connection set and limiter client for the batch; idle between chunks.
        with bridge.delivery_session(channel=channel, clock=clock) as session:
            for offset in range(0, len(ids), chunk_size):
                remaining = budget - (clock.monotonic() - started)
                if remaining < 1 or (stop is not None and stop.is_set()):
                    left = ids[offset:]
                    reminders_unpublished(ids=left, clock=clock)
                    counts["deferred"] += len(left)
                    logger.warning(
                        "Batch stopped with %s reminders left for the next scan", len(left)
                    )
                    break
                chunk = ids[offset : offset + chunk_size]
                token = uuid.uuid4()
                try:
                    claim = reminder_claim_batch(
                        ids=chunk,
                        channel=channel,
                        worker=worker,
                        clock=clock,
                        token=token,
                        addresses=addresses,
                    )
                except BaseException as exc:
                    if database_away(exc):
                        # Nothing later is claimed, and this chunk's claim may have committed
                        # as the connection went: the retry releases it, then delivers them all.
                        connection.close()
                        raise DatabaseUnavailable(ids[offset:], held=(token, chunk)) from exc
                    # Interrupted (a soft time limit), perhaps after the claim committed.
                    release = partial(
                        reminder_release_interrupted,
                        token=token,
                        channel=channel,
                        ids=chunk,
                        clock=clock,
                    )
                    release_interrupted_claim(exc, release, "reminder")
                    raise_interruption(exc)
                counts["skipped"] += len(chunk) - len(claim.reminders)
                if not claim.reminders:
                    continue
                with claim_context(
                    token=claim.token, worker=worker, attempts=claim.attempt_numbers
                ):
                    results = _send(
                        claim,
                        channel=channel,
                        clock=clock,
                        budget=remaining,
                        stop=stop,
                        session=session,
                    )
                    counts.update(record_with_retry(claim=claim, results=results, clock=clock))
    except DatabaseUnavailable:
        raise
    except BaseException:
        # Interrupted (a soft time limit) in a claim, a send or a record: what is still queued
        # (not claimed, or claimed and handed back) is due at the next scan, not when its
        # message expires.
        _hand_back(ids, clock=clock)
        raise
    if counts["skipped"]:
        logger.info("Skipped %s ids that were not claimable now", counts["skipped"])
    return dict(counts)


def record_with_retry(
    *, claim, results: list[DeliveryResult], clock: Clock, record=reminder_record_batch
) -> dict[str, int]:
    """Record a chunk's outcomes with ``record``, retrying while the database is briefly away.

    ``record`` is fenced by the claim token: running it again is harmless.
    """
    # Far inside the lease (config/timing.py): no reaper takes the rows meanwhile.
    give_up_at = clock.monotonic() + settings.REMINDERS_TIME_BOUNDS.record_retry
    delay = 0.5
    interrupted: BaseException | None = None
    while True:
        try:
            counts = record(claim=claim, results=results, clock=clock)
        except BaseException as exc:
            if not database_away(exc):
                # Interrupted (a soft time limit): the record rolled back or committed unseen.
                # Record again on a fresh connection (fenced), then raise the interruption.
                if interrupted is not None:
                    raise
                interrupted = exc
                fresh_connection()
                continue
            connection.close()
            if clock.monotonic() + delay > give_up_at:
                logger.error("Could not record %s outcomes; the lease decides", len(results))
                raise
            logger.warning("Recording outcomes failed (%s); retrying in %.1f s", exc, delay)
            try:
                clock.sleep_blocking(delay)
            except BaseException as stopped:
                # Interrupted while waiting: try again at once, as after one in the record.
                if interrupted is not None:
                    raise
                interrupted = stopped
            delay = min(delay * 2, 5.0)
        else:
            if interrupted is not None:
                raise_interruption(interrupted)
            return counts


def _send(claim, *, clock: Clock, **options) -> list[DeliveryResult]:
    """Render and send a claimed chunk (``options`` go to ``bridge.deliver_envelopes``)."""
    try:
        envelopes, results = build_envelopes(
            claim.reminders,
            lambda reminder: reminder_envelope(
                reminder=reminder, send_by=claim.send_by.get(reminder.pk)
            ),
            claim.refusals,
        )
        watch = ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock)
        # The claim's read is the first snapshot; if rendering outlasted REVOCATION_WINDOW,
        # calls wait for the session's next tick to read again.
        watch.seed(claim.read_at)
    except BaseException as exc:
        # No provider was called: hand the chunk back. An interruption may have
        # landed inside a query, so the release starts on a fresh connection.
        fresh_connection()
        reminder_release(claim=claim, clock=clock)
        raise_interruption(exc)
    # From here on a provider may be called: never release, the lease decides.
    return send_envelopes(claim, envelopes, results, clock=clock, watch=watch, **options)


def send_envelopes(
    claim, envelopes, results: list, *, clock: Clock, record=reminder_record_batch, **options
) -> list[DeliveryResult]:
    """Send a claimed chunk; return ``results`` with theirs. Interrupted, record what is known."""
    try:
        return results + bridge.deliver_envelopes(envelopes, clock=clock, **options)
    except Interrupted as exc:
        # It may have landed in the claim watch's query: record on a fresh connection.
        fresh_connection()
        record_with_retry(claim=claim, results=results + exc.results, clock=clock, record=record)
        raise exc.cause from None


def build_envelopes(rows, build, refusals: dict[int, str]) -> tuple[list, list[DeliveryResult]]:
    """Render claimed rows with ``build``; return envelopes, and results of rows not called.

    A row of ``refusals`` (a suppressed address) is refused saying why; bad data fails its row
    permanently, never the batch.
    """
    envelopes, results = [], []
    for row in rows:
        if (refusal := refusals.get(row.pk)) is not None:
            results.append(_not_sent(row.pk, row.key, refusal))
            continue
        try:
            envelopes.append(build(row))
        except (ValueError, TypeError, LookupError) as exc:
            results.append(_not_sent(row.pk, row.key, f"could not build the message: {exc}"))
    return envelopes, results


def fresh_connection() -> None:
    """Drop the connection (outside a transaction) so the next query opens a clean one."""
    if not connection.in_atomic_block:
        connection.close()


def interruption(exc: BaseException) -> BaseException:
    """Return the first non-database error in ``exc``'s chain, else ``exc``.

    A soft time limit during COMMIT makes Django's clean-up raise a ProgrammingError, which,
    not the interruption, would otherwise reach Celery.
    """
    seen = exc
    while isinstance(seen, Error | psycopg.Error):
        seen = seen.__cause__ or seen.__context__
        if seen is None:
            return exc
    return seen


def database_away(exc: BaseException) -> bool:
    """Return whether ``exc`` says the database cannot take the work now, so it is worth
    waiting for: a lost connection, a timeout, or a read-only session (a failover's standby)."""
    cause = interruption(exc)
    return isinstance(cause, OperationalError | InterfaceError) or read_only(cause)


def raise_interruption(exc: BaseException) -> NoReturn:
    """Raise what interrupted the database call that raised ``exc`` (``interruption``)."""
    cause = interruption(exc)
    if cause is exc:
        raise exc
    raise cause from None


def release_interrupted_claim(exc: BaseException, release: Callable[[], int], kind: str) -> None:
    """Run ``release`` (of a claim ``exc`` interrupted) on a fresh connection; without the
    database, the lease decides."""
    fresh_connection()
    cause = type(interruption(exc)).__name__
    try:
        released = release()
    except Error as error:
        connection.close()
        logger.warning("A %s claim ended by %s was not released (%s)", kind, cause, error)
        return
    logger.warning("A %s claim ended by %s: %s handed back", kind, cause, released)


def _hand_back(ids: list[int], *, clock: Clock) -> None:
    """Make those of ``ids`` still queued due at the next scan (best effort)."""
    fresh_connection()
    try:
        reminders_unpublished(ids=ids, clock=clock)
    except Error as error:
        connection.close()
        logger.warning("%s reminders wait for their message to expire (%s)", len(ids), error)


def _not_sent(reminder_id: int, key: str, error: str) -> DeliveryResult:
    return DeliveryResult(
        reminder_id=reminder_id,
        key=key,
        outcome=Outcome.PERMANENT,
        message_id=None,
        error=error,
        attempts=0,
        provider_reached=False,
        maybe_delivered=False,
    )
