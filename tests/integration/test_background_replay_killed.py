"""A background replay whose worker is killed mid-way is finished by another, each reminder once.

Real worker processes on Redis and PostgreSQL and a loopback SMTP server. The
replay runs one chunk per task; the victim is SIGKILLed (the whole process
group) while its third chunk waits on a row the test holds. Its decision is
left ``running`` with no task behind it; once its heartbeat is older than the
claim lease, the scan hands it to a worker again.
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from clock import SystemClock
from reminders.models import Reminder, StaffDecision
from reminders.services.replay import reminder_replay_later
from reminders.worker import pipeline
from tests.support.processes import celery_worker, process_env
from tests.support.races import held_rows, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]

_real = SystemClock()
CHUNK = 5


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_a_replay_whose_worker_is_killed_mid_way_is_finished_once_by_another(
    live_clock, broker, smtp_sink, due_reminders, django_user_model, settings
):
    ids = sorted(due_reminders(30))
    Reminder.objects.filter(pk__in=ids).update(status="failed", status_reason="550 refused")
    staff = django_user_model.objects.create_user(username="replayer", is_staff=True)
    env = process_env(
        REMINDERS_CHANNEL="smtp",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp_sink.port),
        REMINDERS_REPLAY_CHUNK=str(CHUNK),
        # Long enough for the victim to be killed while it waits on the held row.
        REMINDERS_WORKER_LOCK_TIMEOUT="30",
    )
    with held_rows(Reminder.objects.filter(pk=ids[2 * CHUNK + 2])):  # in the third chunk
        with celery_worker(env, name="victim") as victim:
            result = reminder_replay_later(
                reminders=Reminder.objects.filter(pk__in=ids), actor=staff, clock=live_clock
            )
            decision = StaffDecision.objects.filter(pk=result.audit_id)
            wait_until(
                lambda: decision.get().progress == 2 * CHUNK and _waiting_on_a_lock(),
                what="the victim's third chunk to wait on the held row",
            )
            victim.signal_group(signal.SIGKILL)
            victim.popen.wait(10)
    stalled = decision.get()
    assert (stalled.state, stalled.progress) == ("running", 2 * CHUNK)
    # Nothing is left to run it: its message died with the worker (acknowledged late, it
    # would come back only after the visibility timeout). The scan hands it over again.
    live_clock.advance_to(_real.now() + timedelta(seconds=settings.REMINDERS_LEASE_SECONDS + 1))
    with celery_worker(env, concurrency=2, name="rescuer"):
        assert pipeline.scan(clock=live_clock).get("replays_resumed") == 1
        wait_until(lambda: decision.get().state == "done", what="the replay to finish")
        wait_until(
            # "sending" too: a call in flight when the rescuer stops is handed back pending.
            lambda: (
                not Reminder.objects.filter(status__in=["pending", "queued", "sending"]).exists()
            ),
            what="the replayed reminders to be sent",
        )
    done = decision.get()
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    per_recipient = Counter(r.lower() for m in smtp_sink.received() for r in m.rcpt_tos)
    print(f"\nkilled replay: {done.changed} re-armed, {dict(statuses)}")
    assert (done.changed, done.progress, sorted(done.reminder_ids)) == (30, 30, ids)
    assert statuses == {"sent": 30}
    assert len(per_recipient) == 30 and set(per_recipient.values()) == {1}
