"""Deliver change notices on a worker, as reminders are (same channels, limiter and session)."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from functools import partial

from django.conf import settings

from clock import Clock, default_clock
from reminders.content import notice_envelope
from reminders.services.feedback import suppressions_refusing
from reminders.services.notices import notice_claim, notice_record, notice_release_interrupted
from reminders.services.watch import NoticeWatch
from reminders.worker import bridge
from reminders.worker.pipeline import (
    build_envelopes,
    database_away,
    raise_interruption,
    record_with_retry,
    release_interrupted_claim,
    send_envelopes,
)

logger = logging.getLogger(__name__)


def deliver_notices(
    ids: list[int],
    *,
    clock: Clock | None = None,
    worker: str = "",
    stop=None,
) -> dict[str, int]:
    """Claim, render, send and record the notices ``ids``; return counts by outcome.

    ``stop`` ends the batch between chunks; what is not claimed stays pending.
    """
    clock = clock or default_clock()
    channel = settings.REMINDERS_CHANNEL
    chunk_size = bridge.check_channel(channel, clock=clock)
    started = clock.monotonic()
    budget = float(settings.REMINDERS_BATCH_BUDGET)
    counts: Counter[str] = Counter()
    with bridge.delivery_session(channel=channel, clock=clock) as session:
        for offset in range(0, len(ids), chunk_size):
            remaining = budget - (clock.monotonic() - started)
            if remaining < 1 or (stop is not None and stop.is_set()):
                counts["notices_deferred"] += len(ids) - offset
                break
            chunk, token = ids[offset : offset + chunk_size], uuid.uuid4()
            read_at = clock.monotonic()
            try:
                claim = notice_claim(ids=chunk, channel=channel, clock=clock, token=token)
            except BaseException as exc:
                if not database_away(exc):
                    # A soft time limit, perhaps after the claim committed: hand it back.
                    release = partial(
                        notice_release_interrupted, token=token, ids=chunk, clock=clock
                    )
                    release_interrupted_claim(exc, release, "notice")
                raise_interruption(exc)
            if not claim.notices:
                continue
            envelopes, results = build_envelopes(
                claim.notices,
                lambda notice, send_by=claim.send_by: notice_envelope(
                    notice=notice, send_by=send_by[notice.pk]
                ),
                suppressions_refusing(claim.notices),
            )
            # No call starts over REVOCATION_WINDOW after its attendee's erasure commits.
            watch = NoticeWatch(token=claim.token, notices=claim.notices, clock=clock)
            watch.seed(read_at)
            results = send_envelopes(
                claim,
                envelopes,
                results,
                channel=channel,
                clock=clock,
                budget=remaining,
                stop=stop,
                session=session,
                watch=watch,
                record=notice_record,
            )
            counts.update(
                record_with_retry(claim=claim, results=results, clock=clock, record=notice_record)
            )
    logger.info("Notices %s: %s", worker or "batch", dict(counts))
    return dict(counts)
