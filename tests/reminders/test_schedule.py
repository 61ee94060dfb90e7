"""The beat-owned schedule: one interval task, registered idempotently, following the setting."""

import pytest
from django.core.management import call_command
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from reminders.schedule import SCAN_TASK_NAME, ensure_scan_schedule

pytestmark = pytest.mark.django_db


@pytest.mark.long
def test_migration_registers_one_interval_scan_with_no_clock_based_expiry():
    # Migrated back and forth here: a transactional test run earlier empties every table.
    call_command("migrate", "reminders", "0001", verbosity=0)
    assert not PeriodicTask.objects.filter(name=SCAN_TASK_NAME).exists()
    call_command("migrate", "reminders", verbosity=0)
    assert PeriodicTask.objects.filter(name=SCAN_TASK_NAME).count() == 1
    task = PeriodicTask.objects.get(name=SCAN_TASK_NAME)
    assert task.task == "reminders.scan"
    assert task.crontab is None
    assert (task.interval.every, task.interval.period) == (60, "seconds")
    # A host's clock would judge an expiry; the scan lane drops piled-up scans instead.
    assert task.expire_seconds is None
    assert task.queue == "scan"
    assert task.enabled


def test_registering_again_changes_nothing():
    ensure_scan_schedule()
    before = PeriodicTask.objects.get(name=SCAN_TASK_NAME)
    ensure_scan_schedule()
    ensure_scan_schedule()
    assert PeriodicTask.objects.filter(task="reminders.scan").count() == 1
    assert PeriodicTask.objects.get(name=SCAN_TASK_NAME).pk == before.pk


def test_schedule_follows_the_scan_interval_setting(settings):
    """Change REMINDERS_SCAN_INTERVAL and restart beat (which calls this): the task follows."""
    settings.REMINDERS_SCAN_INTERVAL = 15
    ensure_scan_schedule()
    task = PeriodicTask.objects.get(name=SCAN_TASK_NAME)
    assert task.interval.every == 15
    assert PeriodicTask.objects.filter(task="reminders.scan").count() == 1
    assert IntervalSchedule.objects.filter(every=15, period="seconds").count() == 1


@pytest.mark.django_db(transaction=True)  # beat's scheduler commits and recycles connections
def test_beat_reads_the_interval_of_the_setting_on_its_first_read(settings):
    """The configured scheduler writes the scan's row before it reads the table: its very
    first schedule already has the new interval. (The stock DatabaseScheduler, with the
    sync on ``beat_init``, read the old one first, and a second beat starting at the same
    moment could keep it for five minutes.)"""
    from celery.utils.imports import symbol_by_name

    from config.celery import app

    ensure_scan_schedule(every=60)  # as the migration leaves it (a flush may have emptied it)
    settings.REMINDERS_SCAN_INTERVAL = 7
    scheduler = symbol_by_name(app.conf.beat_scheduler)(app=app, lazy=False)
    entry = scheduler.schedule[SCAN_TASK_NAME]
    assert entry.schedule.run_every.total_seconds() == 7
    assert PeriodicTask.objects.get(name=SCAN_TASK_NAME).interval.every == 7


def test_two_intervals_of_the_same_length_do_not_stop_beat(settings):
    """Two beats starting at once may each create the interval row (it has no unique key)."""
    settings.REMINDERS_SCAN_INTERVAL = 9
    IntervalSchedule.objects.create(every=9, period="seconds")
    IntervalSchedule.objects.create(every=9, period="seconds")
    task = ensure_scan_schedule()
    assert task.interval.every == 9


@pytest.mark.django_db(transaction=True)
def test_two_beats_registering_the_missing_scan_together_both_start(monkeypatch):
    """Two beats started together on a table without the scan's row (deleted, or a flushed test
    database): one creates it, the other finds it. PeriodicTask.save() checks the name's
    uniqueness itself and raised ValidationError, past get_or_create, so one beat died at start
    (once in CI, tests/integration/test_delivery.py::test_two_beat_processes_send_nothing_twice).
    Here both have looked and found nothing; the second saves once the first has committed."""
    import threading
    import time

    from tests.support.races import race

    both_looked = threading.Barrier(2, timeout=10)
    turn = iter(range(3))
    save = PeriodicTask.save

    def save_in_turn(task, *args, **kwargs):
        if task.pk is None:  # a create (a later save may move the task to its own interval)
            both_looked.wait()
            if next(turn):  # the second: saves once the first's row is committed
                deadline = time.monotonic() + 10  # noqa: TID251 (real threads)
                while not PeriodicTask.objects.filter(name=SCAN_TASK_NAME).exists():
                    assert time.monotonic() < deadline, "the first create never committed"  # noqa: TID251
                    time.sleep(0.01)  # noqa: TID251
        return save(task, *args, **kwargs)

    PeriodicTask.objects.filter(name=SCAN_TASK_NAME).delete()
    monkeypatch.setattr(PeriodicTask, "save", save_in_turn)
    made = race(ensure_scan_schedule, ensure_scan_schedule)
    assert made[0].pk == made[1].pk
    assert PeriodicTask.objects.filter(name=SCAN_TASK_NAME).count() == 1
