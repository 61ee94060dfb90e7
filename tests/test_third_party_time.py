"""Time read by code the project does not own, moved with freezegun.

The project reads time only through ``clock`` (a FakeClock in tests). Three
readers are not the project's: django-celery-beat and celery's schedules
decide when the scan is due and stamp ``last_run_at`` (``datetime.now``,
``django.utils.timezone.now``); Django's ``auto_now`` / ``auto_now_add`` stamp
the audit columns of rows saved with ``save()``. freezegun moves that host
time; the FakeClock keeps moving the project's. Where both appear in one test
they are set apart on purpose, so each assertion shows which one a value came
from.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry
from freezegun import freeze_time

from config.celery import app as celery_app
from reminders.models import Reminder
from reminders.schedule import SCAN_QUEUE, SCAN_TASK, SCAN_TASK_NAME, ensure_scan_schedule
from reminders.selectors import scheduler_health
from reminders.worker import pipeline
from workshops.services import (
    attendee_get_or_create,
    enrollment_cancel,
    enrollment_create,
    workshop_create,
    workshop_update,
)

pytestmark = pytest.mark.django_db

# Not the default 60: a schedule that ignored REMINDERS_SCAN_INTERVAL would show.
INTERVAL_SECONDS = 45
INTERVAL = timedelta(seconds=INTERVAL_SECONDS)
# Beat writes last_run_at after every scan (CELERY_BEAT_SYNC_EVERY = 1), so
# beat counts as down after three intervals without a scan, with no extra lag.
STALE_LIMIT = timedelta(seconds=3 * INTERVAL_SECONDS)
# Host time for the beat-only tests (no project clock involved there).
BEAT_T0 = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.fixture
def scan_interval(settings):
    settings.REMINDERS_SCAN_INTERVAL = INTERVAL_SECONDS
    settings.CELERY_BEAT_SYNC_EVERY = 1
    return INTERVAL


def _register_scan() -> PeriodicTask:
    """Register the scan afresh, as the migration and beat_init do (whatever the table held)."""
    PeriodicTask.objects.filter(name=SCAN_TASK_NAME).delete()
    return ensure_scan_schedule()


def _stored_scan() -> PeriodicTask:
    return PeriodicTask.objects.get(name=SCAN_TASK_NAME)


def _beat_entry() -> ModelEntry:
    """The scan as beat's DatabaseScheduler loads it from the table."""
    return ModelEntry(_stored_scan(), app=celery_app)


def _beat_marks_scan_run() -> None:
    """Mark the scan as run, as beat does on sending it: reserve (``next``), then sync (save)."""
    next(_beat_entry()).save()


# --- django-celery-beat: due decisions and last_run_at ------------------------


def test_a_registered_scan_is_first_due_one_interval_after_djangos_date_changed(scan_interval):
    """Never run: beat counts from the row's auto_now ``date_changed``, so the first scan
    goes out one interval after registration, not at once and not later."""
    with freeze_time(BEAT_T0) as frozen:
        registered = _register_scan()
        assert registered.date_changed == BEAT_T0
        assert registered.last_run_at is None
        frozen.move_to(BEAT_T0 + scan_interval - SECOND)
        assert tuple(_beat_entry().is_due()) == (False, 1.0)
        frozen.tick(SECOND)
        assert tuple(_beat_entry().is_due()) == (True, float(INTERVAL_SECONDS))


def test_beat_stamps_last_run_at_and_the_scan_is_due_again_exactly_one_interval_later(
    scan_interval,
):
    with freeze_time(BEAT_T0 - timedelta(days=1)) as frozen:
        _register_scan()
        frozen.move_to(BEAT_T0)
        _beat_marks_scan_run()
        stored = _stored_scan()
        assert (stored.last_run_at, stored.total_run_count) == (BEAT_T0, 1)
        assert stored.interval.every == INTERVAL_SECONDS

        frozen.move_to(BEAT_T0 + scan_interval - SECOND)
        due, next_check = _beat_entry().is_due()
        assert (due, next_check) == (False, 1.0)
        frozen.tick(timedelta(milliseconds=999))
        assert not _beat_entry().is_due()[0]
        frozen.tick(timedelta(milliseconds=1))
        assert tuple(_beat_entry().is_due()) == (True, float(INTERVAL_SECONDS))


@pytest.mark.django_db(transaction=True)  # beat's scheduler commits and recycles connections
def test_database_scheduler_sends_the_scan_once_per_interval_and_stores_when(
    scan_interval, monkeypatch
):
    """The whole beat loop step (DatabaseScheduler.tick): due decision, send, sync to the table."""
    sent: list[tuple[str, str, datetime]] = []

    def record(name, args=None, kwargs=None, **options):
        # Stands in for the publish: what beat sent, and when (its app's now). No broker.
        # No task is registered under the scan's name (the scan lane consumes its
        # queue), so beat sends it by name.
        sent.append((name, options.get("queue"), celery_app.now()))

    monkeypatch.setattr(celery_app, "send_task", record)

    with freeze_time(BEAT_T0) as frozen:
        _register_scan()
        beat = DatabaseScheduler(app=celery_app, lazy=True)
        beat.producer = None  # the recorded apply_async needs no broker connection
        try:
            beat.tick()
            frozen.move_to(BEAT_T0 + scan_interval - SECOND)
            beat.tick()
            assert sent == []
            assert _stored_scan().last_run_at is None

            frozen.tick(SECOND)
            beat.tick()
            first = BEAT_T0 + scan_interval
            assert sent == [(SCAN_TASK, SCAN_QUEUE, first)]
            stored = _stored_scan()
            assert (stored.last_run_at, stored.total_run_count) == (first, 1)

            frozen.tick(scan_interval - SECOND)
            beat.tick()
            assert len(sent) == 1
            frozen.tick(SECOND)
            beat.tick()
            assert [moment for _, _, moment in sent] == [first, first + scan_interval]
            assert _stored_scan().last_run_at == first + scan_interval
        finally:
            beat._finalize()  # run beat's exit sync now, not when the object is collected


# --- Django's auto_now / auto_now_add on audit columns ------------------------


def test_workshop_attendee_and_enrollment_audit_times_are_djangos_auto_now(clock):
    """``created_at``/``updated_at`` of rows saved with save() follow the host time
    (freezegun); the reminder planned alongside carries the project clock's time."""
    host_created = clock.now() - timedelta(hours=3)
    assert host_created != clock.now()
    with freeze_time(host_created) as frozen:
        workshop = workshop_create(
            title="Frozen audit",
            starts_at=clock.now() + timedelta(hours=3),
            duration=timedelta(hours=1),
            timezone="Europe/Berlin",
            clock=clock,
        )
        attendee, created = attendee_get_or_create(email="audit@example.com", name="Audit")
        assert created
        enrollment = enrollment_create(attendee=attendee, workshop=workshop)

        frozen.tick(timedelta(minutes=7))
        workshop_update(workshop=workshop, title="Frozen audit, renamed")
        enrollment_cancel(enrollment=enrollment)

        frozen.tick(timedelta(minutes=5))
        assert enrollment_create(attendee=attendee, workshop=workshop).pk == enrollment.pk

    workshop.refresh_from_db()
    attendee.refresh_from_db()
    enrollment.refresh_from_db()
    assert (workshop.created_at, workshop.updated_at) == (
        host_created,
        host_created + timedelta(minutes=7),
    )
    assert attendee.created_at == host_created
    # Re-activation saves with update_fields=["status", "updated_at"]: auto_now reaches the row.
    assert (enrollment.status, enrollment.created_at, enrollment.updated_at) == (
        enrollment.Status.ACTIVE,
        host_created,
        host_created + timedelta(minutes=12),
    )
    reminder = Reminder.objects.get(enrollment=enrollment)
    assert (reminder.created_at, reminder.updated_at) == (clock.now(), clock.now())


# --- Scheduler health: beat's stored last_run_at against the project clock ----


@pytest.fixture
def beat_ran_at(clock, scan_interval) -> datetime:
    """Beat publishes the scan at the project clock's present, in its own host time
    (freezegun); a worker then runs that scan two seconds later in project time."""
    ran_at = clock.now()
    with freeze_time(ran_at - timedelta(hours=1)) as frozen:
        _register_scan()
        frozen.move_to(ran_at)
        _beat_marks_scan_run()
    clock.advance(2)
    pipeline.scan(clock=clock, publish=lambda ids: True)
    return ran_at


def test_scheduler_health_is_stale_only_once_the_project_clock_passes_stale_after(
    clock, beat_ran_at
):
    health = scheduler_health(clock=clock)
    assert (health.last_scan_at, health.stale_after) == (beat_ran_at, STALE_LIMIT)
    assert (health.is_stale, health.warning) == (False, "")

    clock.advance_to(beat_ran_at + STALE_LIMIT)
    health = scheduler_health(clock=clock)
    assert (health.last_scan_age, health.is_stale, health.warning) == (STALE_LIMIT, False, "")

    clock.advance(1)
    health = scheduler_health(clock=clock)
    assert health.is_stale
    assert "2 minutes ago" in health.warning and "celery beat is down" in health.warning


@pytest.fixture
def health_page(client, django_user_model, settings):
    """GET the admin's scheduler health page as staff allowed to view reminders."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    staff = django_user_model.objects.create_user(
        username="beat-watcher", password="unused-in-tests", is_staff=True
    )
    staff.user_permissions.add(
        Permission.objects.get(content_type__app_label="reminders", codename="view_reminder")
    )
    client.force_login(staff)
    url = reverse("admin:reminders_reminder_health")

    def get() -> str:
        response = client.get(url)
        assert response.status_code == 200
        return response.content.decode()

    return get


def test_health_page_warning_appears_only_after_stale_after_past_beats_stored_run(
    clock, beat_ran_at, health_page
):
    clock.advance_to(beat_ran_at + STALE_LIMIT)
    html = health_page()
    assert 'id="scheduler-ok"' in html
    assert "scheduler-warning" not in html
    assert f"{beat_ran_at:%Y-%m-%d %H:%M:%S} UTC" in html

    clock.advance(1)
    html = health_page()
    assert 'id="scheduler-warning"' in html
    assert "2 minutes ago" in html and "celery beat is down" in html
    assert 'id="scheduler-ok"' not in html
