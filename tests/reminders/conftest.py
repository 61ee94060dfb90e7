from datetime import timedelta

import pytest

from reminders.models import Reminder


@pytest.fixture
def published(monkeypatch):
    """Record batches the dispatcher publishes instead of sending them to the broker."""
    sent: list[tuple[list[int], object]] = []

    def fake_publish(ids, expires_at):
        sent.append((list(ids), expires_at))
        return True

    monkeypatch.setattr("reminders.publish.publish_batch", fake_publish)
    return sent


@pytest.fixture
def due_reminders(clock, make_workshop, enrol):
    """Create ``count`` due reminders spread over workshops; return their ids."""

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
