"""Shared fixtures: a fake clock installed as the process clock, domain factories,
and guards that keep the suite on real PostgreSQL and Redis."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta

import pytest

from clock import FakeClock, SystemClock, set_default_clock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("django"):
        return
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if engine != "django.db.backends.postgresql":
        pytest.exit(
            "The tests run against PostgreSQL, not "
            f"{engine.rsplit('.', 1)[-1]}: set DATABASE_URL=postgres://postgres@127.0.0.1:5432/"
            "reminders (make test does this).",
            returncode=2,
        )
    _empty_tables_by_delete()


def _empty_tables_by_delete() -> None:
    """Empty the tables after a transactional test with DELETE, not TRUNCATE.

    TRUNCATE of every table costs far more than DELETE of a test's few rows; the
    foreign-key triggers are off for that transaction only (``session_replication_role``),
    so the order does not matter. A flush that resets sequences, or a role that may not
    turn the triggers off, still truncates.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or not _superuser(self.connection):
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        deletes = [f"DELETE FROM {self.quote_name(table)};" for table in tables]
        return ["SET LOCAL session_replication_role = replica;", *deletes]

    DatabaseOperations.sql_flush = sql_flush


def _superuser(connection) -> bool:
    """Whether the session may set ``session_replication_role`` (a superuser's right)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = cursor.fetchone()
    return bool(row and row[0])


def pytest_collection_modifyitems(config, items):
    """Tests that start processes first: most of their time is waiting, and spread over
    the xdist workers from the start they overlap the rest instead of ending the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _close_kept_delivery_session():
    """What a pool process's shutdown does: a test's kept provider connections end with it."""
    yield
    bridge = sys.modules.get("reminders.worker.bridge")
    if bridge is not None:
        bridge.close_kept_session()


@pytest.fixture
def clock():
    """Return a FakeClock installed as the process-wide clock for the test."""
    fake = FakeClock(START)
    previous = set_default_clock(fake)
    try:
        yield fake
    finally:
        set_default_clock(previous)


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def make_workshop(clock):
    """Create a scheduled workshop through the service, starting ``starts_in`` from now."""
    from workshops.services import workshop_create

    counter = iter(range(1, 1_000_000))

    def make(
        *,
        starts_in: timedelta = timedelta(hours=3),
        zone: str = "Europe/Berlin",
        title: str | None = None,
        duration: timedelta = timedelta(hours=1),
        **details: str,
    ):
        return workshop_create(
            title=title or f"Workshop {next(counter)}",
            starts_at=clock.now() + starts_in,
            duration=duration,
            timezone=zone,
            clock=clock,
            **details,
        )

    return make


@pytest.fixture
def make_attendee():
    from workshops.services import attendee_get_or_create

    counter = iter(range(1, 1_000_000))

    def make(
        *, email: str | None = None, name: str = "Attendee", zone: str = "", language: str = ""
    ):
        number = next(counter)
        attendee, _ = attendee_get_or_create(
            email=email or f"person{number}@example.com",
            name=f"{name} {number}",
            timezone=zone,
            language=language,
        )
        return attendee

    return make


#: From this many enrollments at once, ``enrol`` inserts the rows in bulk and plans their
#: reminders with the one statement the enrollment service's receiver runs for each.
BULK_ENROL = 20


@pytest.fixture
def enrol(make_attendee, clock):
    """Enrol ``count`` new attendees in ``workshop``; return the enrollments."""
    from reminders.services import reasons
    from reminders.services.plan import reminders_plan
    from workshops.models import Attendee, Enrollment
    from workshops.services import enrollment_create

    batches = iter(range(1, 1_000_000))

    def make(workshop, count: int = 1):
        if count < BULK_ENROL:
            return [
                enrollment_create(attendee=make_attendee(), workshop=workshop) for _ in range(count)
            ]
        assert workshop.is_scheduled, "enrol a scheduled workshop"
        batch = next(batches)
        people = Attendee.objects.bulk_create(
            Attendee(name=f"Attendee {batch}.{i}", email=f"bulk{batch}.{i}@example.com")
            for i in range(count)
        )
        enrollments = Enrollment.objects.bulk_create(
            Enrollment(attendee=person, workshop=workshop) for person in people
        )
        reminders_plan(
            clock=clock,
            enrollments=Enrollment.objects.filter(pk__in=[e.pk for e in enrollments]),
            late_reason=reasons.ENROLLED_LATE,
        )
        return enrollments

    return make


@pytest.fixture
def published(monkeypatch):
    """Record batches the dispatcher publishes instead of sending them to the broker."""
    sent: list[tuple[list[int], object]] = []

    def fake_publish(ids):
        sent.append(list(ids))
        return True

    monkeypatch.setattr("reminders.queue.publish_batch", fake_publish)
    return sent


@pytest.fixture
def due_reminders(clock, make_workshop, enrol):
    """Create ``count`` due reminders spread over workshops; return their ids."""

    from reminders.models import Reminder

    def make(count: int, *, per_workshop: int = 10, starts_in=timedelta(hours=2)):
        ids: list[int] = []
        while len(ids) < count:
            workshop = make_workshop(starts_in=starts_in)
            enrol(workshop, count=min(per_workshop, count - len(ids)))
            planned = Reminder.objects.filter(workshop=workshop).values_list("id", flat=True)
            assert planned, "the workshop starts outside the lead: nothing was planned"
            ids.extend(planned)
        return ids

    return make


@pytest.fixture
def outbox(settings, tmp_path, clock):
    """Deliver through the real file channel; the fake clock moves only when told to.

    File writes run in threads, which the fake clock's autojump cannot see, so
    it would mistake a write in progress for a hung call and time it out.
    """
    clock.autojump = False
    settings.REMINDERS_FILE_DIR = tmp_path / "outbox"
    settings.REMINDERS_CHANNEL = "file"
    return tmp_path / "outbox"


@pytest.fixture
def live_clock(clock):
    """The fake clock moved to the real present: worker processes read the real clock.

    It moves only when the test says so, which is how a test lets a lease
    expire without waiting for it.
    """
    clock.autojump = False
    clock.advance_to(SystemClock().now())
    return clock


@pytest.fixture
def broker(redis_url):
    """The test Redis database, emptied before and after the test."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield redis_url
    client.flushdb()


@pytest.fixture
def smtp_sink():
    """A real SMTP server on 127.0.0.1 that records what it receives."""
    from loopback.smtp_sink import SmtpSink

    with SmtpSink() as sink:
        yield sink


@pytest.fixture
def refusing_port():
    """Return a factory of loopback ports where a connection is refused.

    Each is bound, never listened on, and kept until the test ends: the system gives
    it to no one else meanwhile, so nothing can answer there.
    """
    import socket

    held: list[socket.socket] = []

    def make() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        held.append(sock)
        return sock.getsockname()[1]

    yield make
    for sock in held:
        sock.close()


@pytest.fixture
def mail(clock, smtp_sink, settings):
    """Deliver through a real SMTP server on loopback; the fake clock moves only when told to."""
    clock.autojump = False
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_NOTICE_SETTLE = 300
    return smtp_sink


@pytest.fixture
def notices_published(monkeypatch):
    sent: list[list[int]] = []
    monkeypatch.setattr("reminders.queue.publish_notices", lambda ids: sent.append(list(ids)))
    return sent


@pytest.fixture
def notices_scan(clock, mail, notices_published, monkeypatch, settings):
    """Scan twice, letting the settle period pass between; with ``sent``, deliver the notices."""
    from reminders.worker import pipeline
    from reminders.worker.notices import deliver_notices

    monkeypatch.setattr("reminders.queue.publish_batch", lambda ids: True)

    def scan(*, sent: bool) -> None:
        notices_published.clear()
        pipeline.scan(clock=clock)
        clock.advance(settings.REMINDERS_NOTICE_SETTLE + 1)
        pipeline.scan(clock=clock)
        if sent:
            for batch in list(notices_published):
                deliver_notices(batch, clock=clock)

    return scan


@pytest.fixture
def back_to_latest():
    """Leave the test database at the latest migrations, whatever a test migrated it to."""
    from tests.support.migrations import migrate_to_latest

    yield
    migrate_to_latest()
