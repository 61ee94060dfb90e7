"""Queue due reminders for the workers, and sweep the ones nobody can send any more."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection, transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When

from clock import Clock, default_clock
from reminders import queue
from reminders.models import Dispatch, Reminder, ScanRun, StaffDecision
from reminders.policy import ReminderPolicy
from reminders.schedule import SCAN_NAME
from reminders.services._sql import database_now, update_returning
from reminders.services.settle import ROWS_PER_TRANSACTION

logger = logging.getLogger(__name__)

Status = Reminder.Status
Publish = Callable[[list[int]], object]


# Per dispatch transaction: the locking SELECT, the queueing UPDATE, the Dispatch INSERT.
STATEMENTS_PER_TRANSACTION = 3
# A prune deletes this many rows per statement, and at most PRUNE_PER_SCAN in one scan: a
# backlog (a retention shortened) goes over the next scans in short statements, never as one
# DELETE of millions of rows (its locks and WAL, the scan's statement timeout).
PRUNE_BATCH = 1_000
PRUNE_PER_SCAN = 50_000


def message_expiry(*, deadlines: list[datetime], now: datetime, requeue_after: timedelta):
    """Return when a batch message stops being useful: its latest deadline, or sooner.

    Its rows are queued until then, so an expiry never strands a row that still has time.
    """
    return min(now + requeue_after, max(deadlines))


def reminders_dispatch(
    *,
    publish: Publish | None = None,
    clock: Clock | None = None,
    ids: list[int] | None = None,
) -> int:
    """Queue due reminders and publish them by id in batches after commit; return how many.

    Due includes queued under an expired message, so this is also the reconciler. Only the
    UPDATE finding a row due queues it, so two dispatchers never both publish it. Rows are
    locked ``ROWS_PER_TRANSACTION`` at a time, so a claim waits one short transaction at most.
    An empty ``ids`` queues nothing and sends no statement. ``publish`` defaults to the queue's.
    """
    if ids is not None and not ids:
        return 0
    publish = publish or queue.publish_batch
    clock = clock or default_clock()
    now = database_now(clock)
    batch_size = settings.REMINDERS_BATCH_SIZE
    limit = settings.REMINDERS_DISPATCH_LIMIT
    requeue_after = timedelta(seconds=settings.REMINDERS_REQUEUE_AFTER)
    policy = ReminderPolicy.from_settings()
    due_now = Reminder.due_q(now, policy)
    due = Reminder.objects.filter(due_now).order_by("workshop__starts_at", "id")
    if ids is not None:
        due = due.filter(id__in=ids)
    if connection.in_atomic_block:
        # Inside a caller's transaction (a replay) every lock lasts until it commits.
        chunks = [due[:limit]]
    else:
        # Pick in deadline order unlocked, then lock each share by id, re-checking the due rule:
        # locking with ORDER BY or LIMIT makes PostgreSQL read the whole index of open rows.
        per_transaction = max(batch_size, ROWS_PER_TRANSACTION // batch_size * batch_size)
        candidates = list(due.values_list("id", flat=True)[:limit])
        unordered = due.order_by()
        chunks = [
            unordered.filter(id__in=candidates[start : start + per_transaction])
            for start in range(0, len(candidates), per_transaction)
        ]
    queued = published = 0
    for chunk in chunks:
        with transaction.atomic():
            rows = sorted(
                chunk.select_for_update(skip_locked=True, of=("self",)).values_list(
                    "id", "workshop__starts_at"
                ),
                key=lambda row: (row[1], row[0]),
            )
            if not rows:
                continue
            batches = _queue(
                [(pk, policy.deadline_at(starts)) for pk, starts in rows],
                due_now=due_now,
                now=now,
                batch_size=batch_size,
                requeue_after=requeue_after,
            )
            # The history the trace reads, committed with the rows it names.
            records = Dispatch.objects.bulk_create(
                Dispatch(queued_at=now, expires_at=expires_at, reminder_ids=batch_ids)
                for batch_ids, expires_at in batches
            )
            for record in records:
                transaction.on_commit(partial(_publish, publish, record))
                queued += len(record.reminder_ids)
                published += 1
    if queued:
        logger.info("Dispatched %s reminders in %s batches", queued, published)
    return queued


def _queue(rows, *, due_now: Q, now: datetime, batch_size: int, requeue_after: timedelta):
    """Mark locked due ``rows`` queued in one statement; return the batches to publish."""
    batches = []
    by_expiry: dict[datetime, list[int]] = defaultdict(list)
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        expires_at = message_expiry(
            deadlines=[deadline for _, deadline in batch], now=now, requeue_after=requeue_after
        )
        batches.append(([pk for pk, _ in batch], expires_at))
        by_expiry[expires_at].extend(pk for pk, _ in batch)
    # PostgreSQL's FOR UPDATE re-checked the due rule: match by id alone (repeating it scans
    # every open row). SQLite takes no row locks, so there the UPDATE re-checks the rule.
    target = Reminder.objects.filter(id__in=[pk for pk, _ in rows])
    if connection.vendor != "postgresql":
        target = target.filter(due_now)
    changed = {
        pk
        for pk, _ in update_returning(
            target,
            status=Status.QUEUED,
            queued_until=Case(
                *[When(id__in=pks, then=Value(expiry)) for expiry, pks in by_expiry.items()],
                output_field=DateTimeField(),
            ),
            # A requeued row keeps when it first entered the queue (reminders_oldest_seconds).
            queued_at=Case(
                When(status=Status.QUEUED, queued_at__isnull=False, then=F("queued_at")),
                default=Value(now),
                output_field=DateTimeField(),
            ),
            updated_at=now,
        )
    }
    kept = [([pk for pk in pks if pk in changed], expires_at) for pks, expires_at in batches]
    return [(pks, expires_at) for pks, expires_at in kept if pks]


def dispatches_prune(*, clock: Clock | None = None) -> int:
    """Delete dispatch records older than REMINDERS_DISPATCH_HISTORY_DAYS; return how many.

    ``PRUNE_BATCH`` rows a statement, at most ``PRUNE_PER_SCAN`` in one call.
    """
    clock = clock or default_clock()
    cutoff = clock.now() - timedelta(days=settings.REMINDERS_DISPATCH_HISTORY_DAYS)
    # A bare DELETE: nothing points at a Dispatch, and QuerySet.delete() adds a transaction.
    table = connection.ops.quote_name(Dispatch._meta.db_table)
    deleted = 0
    with connection.cursor() as cursor:
        while deleted < PRUNE_PER_SCAN:
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} "
                "WHERE queued_at < %s ORDER BY queued_at LIMIT %s)",
                [connection.ops.adapt_datetimefield_value(cutoff), PRUNE_BATCH],
            )
            deleted += cursor.rowcount
            if cursor.rowcount < PRUNE_BATCH:
                break
    return deleted


def sessions_prune(*, clock: Clock | None = None) -> int:
    """Delete expired staff sessions, as manage.py clearsessions would; return how many."""
    clock = clock or default_clock()
    return Session.objects.filter(expire_date__lt=clock.now()).delete()[0]


def _publish(publish: Publish, record: Dispatch) -> None:
    if publish(record.reminder_ids) is False:
        reminders_unpublished(ids=record.reminder_ids)
        # The trace says so: its rows wait for the next scan, not for this message.
        Dispatch.objects.filter(pk=record.pk).update(
            publish_failed_at=database_now(default_clock())
        )


def reminders_unpublished(*, ids: list[int], clock: Clock | None = None) -> int:
    """Make queued reminders whose message failed to publish due again at the next scan."""
    clock = clock or default_clock()
    return Reminder.objects.filter(id__in=ids, status=Status.QUEUED).update(
        queued_until=database_now(clock)
    )


def replays_resume(*, publish: Callable[[int], object], clock: Clock | None = None) -> int:
    """Hand each background replay whose heartbeat stopped to a worker again; return how many.

    The guarded UPDATE lets one of two scans resume it; a merely slow one then runs in two
    tasks, harmlessly, as each chunk is taken under the decision's lock.
    """
    now = database_now(clock or default_clock())
    stalled = StaffDecision.objects.filter(
        state=StaffDecision.State.RUNNING,
        heartbeat_at__lte=now - timedelta(seconds=settings.REMINDERS_LEASE_SECONDS),
    )
    resumed = 0
    for pk in stalled.values_list("pk", flat=True):
        with transaction.atomic():
            if stalled.filter(pk=pk).update(heartbeat_at=now):
                transaction.on_commit(partial(publish, pk))
                resumed += 1
    if resumed:
        logger.warning("Handed %s stalled background replays to a worker again", resumed)
    return resumed


def scan_completed(
    *,
    counts: dict[str, int],
    duration: float,
    phase_seconds: dict[str, float] | None = None,
    worker: str = "",
    clock: Clock | None = None,
) -> None:
    """Record that a scan finished now, what it did and how long it and each phase took."""
    now = (clock or default_clock()).now()
    values = {
        "finished_at": now,
        "duration_seconds": round(duration, 3),
        "counts": counts,
        "phase_seconds": phase_seconds or {},
        "worker": worker[:200],
    }
    updated = ScanRun.objects.filter(name=SCAN_NAME).update(completed=F("completed") + 1, **values)
    if not updated:
        ScanRun.objects.get_or_create(name=SCAN_NAME, defaults={**values, "completed": 1})
