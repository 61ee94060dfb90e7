"""A worker frozen past its lease (SIGSTOP: a VM pause, a swap storm) wakes up harmless.

Real worker processes on Redis and PostgreSQL, a real provider on loopback
that answers after a second. The victim is stopped while a chunk of its calls
is in flight; meanwhile its lease is reaped (the test's clock is moved past
it) and a second worker sends what it held and what it had not claimed yet,
or the deadline passes. Then the victim is continued: it must start no call
(nothing reaches the provider after the SIGCONT), and nothing it records may
overwrite the newer owner's outcome.
"""

from __future__ import annotations

import signal
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta

import pytest

from clock import SystemClock
from loopback.http_sink import HttpSink
from reminders.models import DeliveryAttempt, Reminder
from reminders.services import reminders_reap
from reminders.worker import pipeline
from tests.support.processes import celery_worker, process_env
from tests.support.races import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]

_real = SystemClock()
PROVIDER_DELAY = 1.0
CHUNK = 2


@contextmanager
def _provider(channel: str, smtp_sink):
    """Yield (environment, call start times at the provider, calls begun so far) for one
    that answers after a second."""
    if channel == "smtp":
        smtp_sink.data_delay = PROVIDER_DELAY
        env = {
            "REMINDERS_CHANNEL": "smtp",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(smtp_sink.port),
            "REMINDERS_SMTP_CONNECTIONS": str(CHUNK),
        }
        # When each call began (its connection's EHLO, or MAIL FROM on a reused one), not
        # when its data was accepted: a call started before the freeze may finish after
        # SIGCONT.
        yield (
            env,
            lambda: [message.began_at for message in smtp_sink.received()],
            lambda: len(smtp_sink.mail_commands),
        )
        return
    with HttpSink(clock=_real) as sink:
        sink.configure(delay=PROVIDER_DELAY)
        env = {
            "REMINDERS_CHANNEL": "http",
            "REMINDERS_HTTP_URL": sink.url,
            "REMINDERS_HTTP_SECRET": "s3cret-s3cret-s3cret-s3cret-s3cret",
        }
        yield env, sink.call_starts, lambda: len(sink.call_starts())


def _freeze_with_a_chunk_in_flight(victim, begun) -> None:
    # Claimed is not enough: the provider must have seen the calls begin (it answers
    # a second later). A worker frozen between its claim and its calls:
    # tests/reminders/test_frozen_text.py.
    wait_until(
        lambda: Reminder.objects.filter(status="sending").count() == CHUNK and begun() == CHUNK,
        what="the victim's first chunk in flight",
    )
    victim.signal_group(signal.SIGSTOP)


def _continue_and_watch(victim, arrivals) -> float:
    """SIGCONT the victim, let it run out its batch; return when it was continued."""
    assert not any("Batch of" in line for line in victim.lines), (
        "the batch ended before the victim was stopped: the test proves nothing"
    )
    continued = _real.monotonic()
    victim.signal_group(signal.SIGCONT)
    try:
        wait_until(
            lambda: (
                any("finished" in line and "Batch of" in line for line in victim.lines)
                or any("deliver_batch" in line and "succeeded" in line for line in victim.lines)
            ),
            timeout=60,
            what="the victim to finish its batch",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it printed:\n{victim.output()}") from None
    return continued


@pytest.mark.parametrize("channel", ["http", "smtp"])
def test_a_frozen_worker_whose_lease_was_reaped_starts_no_call_and_overwrites_nothing(
    live_clock, broker, smtp_sink, make_workshop, enrol, settings, channel
):
    enrol(make_workshop(starts_in=timedelta(hours=3)), count=8)
    with _provider(channel, smtp_sink) as (provider_env, arrivals, begun):
        env = process_env(
            REMINDERS_CONCURRENCY=str(CHUNK), REMINDERS_BATCH_SIZE="8", **provider_env
        )
        with celery_worker(env, name="victim") as victim:
            try:
                pipeline.scan(clock=live_clock)
                _freeze_with_a_chunk_in_flight(victim, begun)
                held = set(Reminder.objects.filter(status="sending").values_list("id", flat=True))
                # Frozen past its lease: the reaper (keyed rows back to pending, smtp's
                # unknown) and the next scan queue what it held and had not claimed.
                live_clock.advance(
                    settings.REMINDERS_LEASE_SECONDS + settings.REMINDERS_REQUEUE_AFTER
                )
                assert sum(reminders_reap(clock=live_clock).values()) == CHUNK
                with celery_worker(env, name="rescuer"):
                    pipeline.scan(clock=live_clock)
                    wait_until(
                        lambda: (
                            not Reminder.objects.filter(
                                status__in=["pending", "queued", "sending"]
                            ).exists()
                        ),
                        what="the rescuer to send the rest",
                    )
                before = {
                    r.pk: (r.status, r.claim_token, r.provider_message_id)
                    for r in Reminder.objects.all()
                }
                continued = _continue_and_watch(victim, arrivals)
            finally:
                victim.signal_group(signal.SIGCONT)
        late_calls = [t - continued for t in arrivals() if t > continued]
    after = {r.pk: (r.status, r.claim_token, r.provider_message_id) for r in Reminder.objects.all()}
    statuses = Counter(status for status, _, _ in after.values())
    print(f"\nfrozen {channel}: {dict(statuses)}, calls after SIGCONT {late_calls}")
    assert late_calls == [], "the woken worker started calls"
    assert after == before, "the woken worker changed rows a newer owner had decided"
    if channel == "http":
        assert statuses == {"sent": 8}
    else:  # no key: what the frozen worker held may have arrived, so staff decide
        assert statuses == {"sent": 6, "unknown": 2}
        assert {pk for pk, (status, _, _) in after.items() if status == "unknown"} == held
    victims = DeliveryAttempt.objects.filter(worker__startswith="victim@")
    assert set(victims.values_list("outcome", flat=True)) == {"lease_expired"}


def test_a_worker_frozen_past_the_deadline_starts_no_call_after_it(
    live_clock, broker, smtp_sink, make_workshop, enrol, settings
):
    """Its workshop's cutoff passes while it is stopped: the claims of the rest are refused by
    the database's clock and end missed; no call reaches the provider after the SIGCONT."""
    cutoff = timedelta(minutes=settings.REMINDERS_CUTOFF_MINUTES)
    # Time for the first chunk's calls to start (none starts under 2 s before the
    # deadline, DeliveryLimits.min_call_window), not for the rest.
    enrol(make_workshop(starts_in=cutoff + timedelta(seconds=12)), count=6)
    with _provider("smtp", smtp_sink) as (provider_env, arrivals, begun):
        env = process_env(
            REMINDERS_CONCURRENCY=str(CHUNK), REMINDERS_BATCH_SIZE="6", **provider_env
        )
        with celery_worker(env, name="victim") as victim:
            try:
                pipeline.scan(clock=live_clock)
                _freeze_with_a_chunk_in_flight(victim, begun)
                deadline = Reminder.objects.select_related("workshop").first().deadline_at
                wait_until(
                    lambda: _real.now() > deadline + timedelta(seconds=1), what="the deadline"
                )
                continued = _continue_and_watch(victim, arrivals)
            finally:
                victim.signal_group(signal.SIGCONT)
        late_calls = [t - continued for t in arrivals() if t > continued]
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    print(f"\nfrozen past the deadline: {dict(statuses)}, calls after SIGCONT {late_calls}")
    assert late_calls == []
    assert statuses["sent"] <= CHUNK and statuses["missed"] >= 6 - CHUNK
    assert statuses["sent"] + statuses["missed"] + statuses["unknown"] == 6
