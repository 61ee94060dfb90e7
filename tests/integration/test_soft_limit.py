"""Item 7: a soft time limit that fires mid-batch still records the outcomes known then.

Celery's prefork pool implements the soft limit with SIGUSR1, whose handler
raises ``SoftTimeLimitExceeded`` in the task's thread. This test installs the
same handler and sends the same signal to its own process while a batch runs
against a real SMTP server, then counts rows.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta

import pytest
from billiard.exceptions import SoftTimeLimitExceeded
from django.db import connection

from clock import SystemClock
from reminders.models import DeliveryAttempt, Reminder
from reminders.services import reminders_dispatch
from reminders.worker import pipeline
from tests.support.races import interrupted_while_it_waits

# Autocommit, as in a worker: the signal may land inside a query, and no test
# transaction may hide (or suffer) what that does to the connection.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

_real = SystemClock()


def _raise_soft_limit(signum, frame):
    raise SoftTimeLimitExceeded()


@pytest.mark.parametrize(
    "lands", ["while_waiting", "inside_the_claim_watch", "before_the_first_call"]
)
def test_a_soft_time_limit_mid_batch_records_what_is_known(
    live_clock, smtp_sink, make_workshop, enrol, settings, monkeypatch, lands
):
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_SMTP_CONNECTIONS = 4
    settings.REMINDERS_CONCURRENCY = 20  # one chunk of 20, four calls at a time
    smtp_sink.data_delay = 0.5
    enrol(make_workshop(starts_in=timedelta(hours=3)), count=20)
    ids = list(Reminder.objects.values_list("id", flat=True))

    def fire_when_under_way() -> None:
        give_up = _real.monotonic() + 20
        while len(smtp_sink.received()) < 6 and _real.monotonic() < give_up:
            _real.sleep_blocking(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)

    if lands != "while_waiting":
        # The signal arrives while the calling thread reads the claimed rows in
        # a refresh during the batch, or as it takes the claim's own read as the
        # first snapshot, before any call of its chunk (the chunk is then
        # handed back).
        from reminders.services.watch import ClaimWatch

        fired = threading.Event()
        step = "refresh" if lands == "inside_the_claim_watch" else "seed"
        real_step = getattr(ClaimWatch, step)

        def step_then_signal(watch, *args) -> None:
            if len(smtp_sink.received()) >= 6 and not fired.is_set():
                fired.set()  # once, as Celery does
                os.kill(os.getpid(), signal.SIGUSR1)
            real_step(watch, *args)

        monkeypatch.setattr(ClaimWatch, step, step_then_signal)
    previous = signal.signal(signal.SIGUSR1, _raise_soft_limit)
    try:
        if lands == "while_waiting":
            threading.Thread(target=fire_when_under_way, daemon=True).start()
        with pytest.raises(SoftTimeLimitExceeded):
            pipeline.deliver(ids, clock=_real, channel="smtp")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    received = len(smtp_sink.received())
    print(f"\nsoft limit: {dict(statuses)}; received {received}")
    assert statuses["sending"] == 0, "outcomes known at the soft limit were not recorded"
    assert statuses["unknown"] == 0  # calls in flight drained to a known outcome
    assert statuses["sent"] == received >= 6
    assert statuses["sent"] + statuses["pending"] == 20
    assert not DeliveryAttempt.objects.filter(outcome="in_flight").exists()


def _eight_smtp_reminders(settings, smtp_sink, make_workshop, enrol) -> list[int]:
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_SMTP_CONNECTIONS = 4  # chunks of 4
    enrol(make_workshop(starts_in=timedelta(hours=3)), count=8)
    # Queued as the scan's dispatch leaves them, until their message expires.
    assert reminders_dispatch(publish=lambda ids: None, clock=_real) == 8
    return list(Reminder.objects.order_by("id").values_list("id", flat=True))


def _waiting_on_an_expiry() -> int:
    """Return how many rows are still queued under a message that has not expired: a batch
    ended by the interruption should have made what it did not claim due at the next scan."""
    return Reminder.objects.filter(status="queued", queued_until__gt=_real.now()).count()


# The statements that commit a chunk's claim and its record: on PostgreSQL
# each is one statement in autocommit (reminders.services.claim, .record).
CLAIM = "taken AS (UPDATE"
RECORD = "done AS ("


@contextmanager
def _interrupt_statement(marker: str, *, committed: bool):
    """Make the test's first statement containing ``marker`` raise ``SoftTimeLimitExceeded``:
    after the server ran it (and so committed it), with the connection busy again, as
    when the signal lands inside psycopg's wait for the answer; or before it was sent.
    Yield the list of statements interrupted."""
    seen = []

    def interrupt(execute, sql, params, many, context):
        if seen or marker not in sql:
            return execute(sql, params, many, context)
        seen.append(sql)
        if committed:
            execute(sql, params, many, context)
            context["connection"].connection.pgconn.send_query(b"SELECT pg_sleep(0.2)")
        raise SoftTimeLimitExceeded()

    with connection.execute_wrapper(interrupt):
        yield seen


@pytest.mark.parametrize("committed", [True, False], ids=["after_commit", "before_commit"])
def test_a_soft_time_limit_inside_the_claims_commit_leaves_nothing_claimed(
    live_clock, smtp_sink, make_workshop, enrol, settings, committed
):
    """The signal lands in the first chunk's claim, in its COMMIT. Either way the batch ends
    with the interruption itself, nothing stays claimed, no provider was called, and the
    next query works."""
    ids = _eight_smtp_reminders(settings, smtp_sink, make_workshop, enrol)
    with _interrupt_statement(CLAIM, committed=committed) as seen:
        with pytest.raises(SoftTimeLimitExceeded):
            pipeline.deliver(ids, clock=_real, channel="smtp")

    assert seen
    rows = list(Reminder.objects.order_by("id").values_list("status", "attempts", "claim_token"))
    # A chunk whose claim committed is handed back (pending); the rest stays queued.
    first = "pending" if committed else "queued"
    assert rows == [(first, 0, None)] * 4 + [("queued", 0, None)] * 4
    assert _waiting_on_an_expiry() == 0
    attempts = Counter(DeliveryAttempt.objects.values_list("outcome", flat=True))
    assert attempts == (Counter({"not_started": 4}) if committed else Counter())
    assert smtp_sink.received() == []


@pytest.mark.parametrize("committed", [True, False], ids=["after_commit", "before_commit"])
def test_a_soft_time_limit_inside_the_records_commit_records_the_chunk_once(
    live_clock, smtp_sink, make_workshop, enrol, settings, committed
):
    """The signal lands in the first chunk's record, in its COMMIT: the outcomes are known,
    so they are written on a fresh connection (fenced: a record that committed changes
    nothing the second time), and then the interruption ends the batch."""
    ids = _eight_smtp_reminders(settings, smtp_sink, make_workshop, enrol)
    with _interrupt_statement(RECORD, committed=committed) as seen:
        with pytest.raises(SoftTimeLimitExceeded):
            pipeline.deliver(ids, clock=_real, channel="smtp")
    assert seen

    statuses = list(Reminder.objects.order_by("id").values_list("status", flat=True))
    assert statuses == ["sent"] * 4 + ["queued"] * 4
    assert _waiting_on_an_expiry() == 0
    assert Counter(DeliveryAttempt.objects.values_list("outcome", flat=True)) == {"sent": 4}
    assert len(smtp_sink.received()) == 4


def test_a_claim_committed_after_the_interruption_is_still_released(
    live_clock, smtp_sink, make_workshop, enrol, settings
):
    """The signal lands while the first claim's statement waits for a row another
    transaction holds, and the server runs it to its end (and so commits it) only after
    the worker dropped that connection and opened another: the release queues behind it
    for the same rows, then hands them back, instead of finding nothing and leaving them
    ``sending`` for the lease."""
    ids = _eight_smtp_reminders(settings, smtp_sink, make_workshop, enrol)
    with interrupted_while_it_waits("reminders_reminder", ids[0], CLAIM, SoftTimeLimitExceeded):
        with pytest.raises(SoftTimeLimitExceeded):
            pipeline.deliver(ids, clock=_real, channel="smtp")

    rows = list(Reminder.objects.order_by("id").values_list("status", "attempts", "claim_token"))
    assert rows == [("pending", 0, None)] * 4 + [("queued", 0, None)] * 4
    assert _waiting_on_an_expiry() == 0
    assert Counter(DeliveryAttempt.objects.values_list("outcome", flat=True)) == {"not_started": 4}
    assert smtp_sink.received() == []
