"""Scheduler health (FAULTS T8): the last scan from beat's own records, counts, and the warning.

Nothing in reminders.selectors is cached, and the send path never imports it:
a delivery decision is never taken from a read made for the staff surface.
"""

from __future__ import annotations

import ast
import sys
from datetime import timedelta
from pathlib import Path

import grimp
import pytest
import redis
from celery.beat import Scheduler
from django_celery_beat.models import PeriodicTask

from clock import SystemClock
from reminders.models import Reminder
from reminders.schedule import SCAN_TASK_NAME, ensure_scan_schedule
from reminders.selectors import BEAT_SYNC_SECONDS, scheduler_health, stale_after
from tests.support.processes import Proc, process_env
from workshops.services import workshop_update

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
HEALTH = "/admin/reminders/reminder/health/"
CHANGELIST = "/admin/reminders/reminder/"
SEND_PATH = (
    "reminders.services.claim",
    "reminders.worker.pipeline",
    "reminders.services",
    "reminders.queue",
    "reminders.worker.bridge",
    "reminders.content",
    "reminders.policy",
)


@pytest.fixture
def scan_task(db):
    """The scan's PeriodicTask, as the migration registers it (transactional tests flush it)."""
    return ensure_scan_schedule()


def _last_scan(task, at) -> None:
    PeriodicTask.objects.filter(pk=task.pk).update(last_run_at=at)


def _completed(clock, at) -> None:
    """Record a scan that finished at ``at``, as reminders.worker.pipeline.scan does at its end."""
    from clock import FakeClock
    from reminders.services import scan_completed

    scan_completed(counts={"dispatched": 3}, duration=0.25, worker="w1", clock=FakeClock(at))


def test_scan_that_never_ran_is_a_warning(scan_task, clock):
    health = scheduler_health(clock=clock)
    assert (health.last_scan_at, health.scan_registered, health.is_stale) == (None, True, True)
    assert health.warning == (
        "Celery beat has never started a scan: start exactly one `celery -A config beat`. "
        "No new reminder is being queued."
    )


def test_recent_scan_is_healthy_and_an_old_one_says_beat_is_down(scan_task, clock, settings):
    settings.REMINDERS_SCAN_INTERVAL = 60
    settings.CELERY_BEAT_SYNC_EVERY = 1
    _last_scan(scan_task, clock.now() - timedelta(seconds=180))
    _completed(clock, clock.now() - timedelta(seconds=170))
    health = scheduler_health(clock=clock)
    assert (health.is_stale, health.warning) == (False, "")
    clock.advance(1)
    health = scheduler_health(clock=clock)
    assert health.is_stale
    assert health.warning == (
        "The last scan started 3 minutes ago, more than 3 scan intervals: celery beat is down. "
        "Start exactly one `celery -A config beat`; due reminders wait until it runs."
    )


def test_stale_after_allows_for_beats_delayed_write_unless_it_writes_every_scan(settings):
    """beat keeps last_run_at in memory for up to sync_every unless CELERY_BEAT_SYNC_EVERY = 1."""
    assert BEAT_SYNC_SECONDS == Scheduler.sync_every
    settings.REMINDERS_SCAN_INTERVAL = 60
    settings.CELERY_BEAT_SYNC_EVERY = 1
    assert stale_after() == timedelta(seconds=180)
    settings.CELERY_BEAT_SYNC_EVERY = 0
    assert stale_after() == timedelta(seconds=180 + Scheduler.sync_every)


def test_disabled_or_missing_scan_is_a_warning(scan_task, clock):
    _last_scan(scan_task, clock.now())
    PeriodicTask.objects.filter(pk=scan_task.pk).update(enabled=False)
    assert "is disabled in Periodic tasks" in scheduler_health(clock=clock).warning
    PeriodicTask.objects.filter(pk=scan_task.pk).delete()
    health = scheduler_health(clock=clock)
    assert not health.scan_registered
    assert health.warning.startswith(f"The periodic scan ({SCAN_TASK_NAME!r}) is not registered")


def test_health_counts_due_queued_sending_failed_and_unknown(
    scan_task, clock, make_reminders, settings
):
    make_reminders(3, "pending")
    make_reminders(2, "queued")
    make_reminders(1, "sending")
    make_reminders(2, "failed")
    make_reminders(1, "unknown")
    (moved,) = make_reminders(1, "pending")
    workshop = Reminder.objects.get(pk=moved).workshop
    workshop_update(  # a day later: the window is not open, the reminder is not due
        workshop=workshop,
        starts_at=workshop.starts_at + timedelta(days=1),
        ends_at=workshop.ends_at + timedelta(days=1),
    )
    health = scheduler_health(clock=clock)
    assert (health.due_now, health.queued, health.sending, health.failed, health.unknown) == (
        3,
        2,
        1,
        2,
        1,
    )
    assert health.lease_expired == 0
    clock.advance(max(settings.REMINDERS_LEASE_SECONDS, settings.REMINDERS_REQUEUE_AFTER))
    later = scheduler_health(clock=clock)
    # The queued messages expired (the next scan queues them again); the lease ran out.
    assert (later.due_now, later.lease_expired) == (5, 1)


def test_due_now_counts_exactly_the_rows_the_scan_would_queue(scan_task, clock, make_reminders):
    """A workshop or enrollment cancelled by a path that does not settle (a
    ``QuerySet.update()``) leaves its reminders pending until the scan settles them: the scan
    never queues them, so they are not due."""
    from reminders.services import reminders_dispatch
    from workshops.models import Enrollment, Workshop

    make_reminders(2, "pending")
    (off,) = make_reminders(1, "pending")
    Workshop.objects.filter(reminders=off).update(status=Workshop.Status.CANCELLED)
    (gone,) = make_reminders(1, "pending")
    Enrollment.objects.filter(reminders=gone).update(status=Enrollment.Status.CANCELLED)
    assert scheduler_health(clock=clock).due_now == 2
    assert reminders_dispatch(clock=clock, publish=lambda ids: True) == 2


def test_health_view_shows_the_warning_and_the_counts(
    scan_task, clock, login, viewer, make_reminders
):
    make_reminders(2, "failed")
    page = login(viewer).get(HEALTH)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="scheduler-warning"' in html and "Celery beat has never started a scan" in html
    assert ("Failed", 2, f"{CHANGELIST}?status__exact=failed") in page.context["rows"]


def test_health_view_says_beat_is_running_after_a_recent_scan(scan_task, clock, login, viewer):
    _last_scan(scan_task, clock.now() - timedelta(seconds=40))
    _completed(clock, clock.now() - timedelta(seconds=39))
    html = login(viewer).get(HEALTH).content.decode()
    assert (
        "Celery beat is running and scans complete: the last scan was published "
        "0\xa0minutes ago and finished 0\xa0minutes ago." in html
    )
    assert "in 0.25 s:\n      dispatched 3" in html
    assert "scheduler-warning" not in html


def test_scans_published_but_never_finishing_are_a_warning(scan_task, clock, settings):
    """Item 11: beat's publish alone is no heartbeat; a scan must also finish."""
    settings.REMINDERS_SCAN_INTERVAL = 60
    settings.CELERY_BEAT_SYNC_EVERY = 1
    _last_scan(scan_task, clock.now() - timedelta(seconds=30))
    health = scheduler_health(clock=clock)
    assert (health.is_stale, health.scans_stalled) == (False, True)
    assert health.warning.startswith("Celery beat publishes scans but no scan has finished yet")
    _completed(clock, clock.now() - timedelta(seconds=30))
    assert scheduler_health(clock=clock).warning == ""
    clock.advance(151)  # beat keeps publishing; the last completion grows old
    _last_scan(scan_task, clock.now() - timedelta(seconds=10))
    health = scheduler_health(clock=clock)
    assert health.warning == (
        "Celery beat publishes scans but none has finished for 3 minutes: are the workers "
        "running and reaching the database and the broker? Due reminders are not being "
        "queued or reaped."
    )


def test_reminders_list_links_to_health_and_warns_when_beat_is_down(
    scan_task, clock, login, viewer
):
    _last_scan(scan_task, clock.now() - timedelta(hours=2))
    html = login(viewer).get(CHANGELIST).content.decode()
    assert HEALTH in html
    assert "The last scan started 120 minutes ago" in html
    assert "Last scan: 2026-03-02 07:00:00 UTC" in html


def test_health_view_needs_the_view_permission(scan_task, login, make_staff):
    assert login(make_staff()).get(HEALTH).status_code == 403


def test_send_path_never_imports_the_selectors():
    """Delivery decides on the rows (guarded UPDATEs), never on a read made for staff."""
    graph = grimp.build_graph("reminders", "workshops", "clock", "delivery", cache_dir=None)
    chains = {
        module: graph.find_shortest_chain(importer=module, imported="reminders.selectors")
        for module in SEND_PATH
    }
    assert chains == dict.fromkeys(SEND_PATH)


def test_selectors_cache_nothing():
    """Reading health is cheap; a cache could claim beat is alive when it is not."""
    tree = ast.parse((ROOT / "reminders" / "selectors.py").read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else f"{node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not {name for name in imported if "cache" in name or "lru" in name}, imported
    assert "lru_cache" not in (ROOT / "reminders" / "selectors.py").read_text()


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.django_db(transaction=True)
def test_running_beat_turns_the_health_green_and_stopping_it_turns_it_red(
    clock, redis_url, tmp_path
):
    """T8 with a real celery beat: its own record of the last scan is what staff see."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    clock.autojump = False
    clock.advance_to(SystemClock().now())
    ensure_scan_schedule()
    assert scheduler_health(clock=clock).last_scan_at is None
    celery = str(Path(sys.executable).with_name("celery"))
    beat = Proc(
        [celery, "-A", "config", "beat", "--loglevel=INFO",
         f"--pidfile={tmp_path}/beat.pid", f"--schedule={tmp_path}/beat.db"],
        process_env(REMINDERS_SCAN_INTERVAL="5"),
        "beat",
    )  # fmt: skip
    try:
        beat.wait_ready()
        beat.wait_for_line("Sending due task", timeout=30)
        real = SystemClock()
        deadline = real.monotonic() + 20
        while scheduler_health(clock=clock).last_scan_at is None and real.monotonic() < deadline:
            real.sleep_blocking(0.2)
        clock.advance_to(SystemClock().now())
        health = scheduler_health(clock=clock)
        assert health.last_scan_at is not None, beat.output()
        assert health.is_stale is False
        # Published, but no worker runs it: not green until a scan finishes.
        assert health.warning.startswith("Celery beat publishes scans but no scan has finished")
        from reminders.worker import pipeline

        pipeline.scan(clock=clock, publish=lambda ids: True)
        assert scheduler_health(clock=clock).warning == ""
    finally:
        beat.stop()
        client.flushdb()
    clock.advance(scheduler_health(clock=clock).stale_after.total_seconds() + 1)
    assert "celery beat is down" in scheduler_health(clock=clock).warning
