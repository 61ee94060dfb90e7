"""A pool process keeps its provider connections from batch to batch (REMINDERS_KEEP_CONNECTIONS)."""

from collections import Counter

import pytest

from reminders import bridge, pipeline
from reminders.models import Reminder

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def three_batches(clock, due_reminders, published, smtp_sink, settings):
    clock.autojump = False  # real sockets: the fake clock moves only when told to
    settings.REMINDERS_CHANNEL = "smtp"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_sink.port
    settings.REMINDERS_SMTP_CONNECTIONS = 4
    settings.REMINDERS_BATCH_SIZE = 10
    due_reminders(30)
    pipeline.scan(clock=clock)
    batches = [batch for batch, _ in published]
    assert [len(batch) for batch in batches] == [10, 10, 10]
    return batches


@pytest.mark.parametrize(("keep", "opened"), [(10, 4), (0, 8)])
def test_batches_back_to_back_share_the_smtp_sessions_unless_keeping_is_off(
    keep, opened, three_batches, clock, smtp_sink, settings
):
    settings.REMINDERS_KEEP_CONNECTIONS = keep
    for batch in three_batches[:2]:
        assert pipeline.deliver(batch, clock=clock)["sent"] == 10
    assert smtp_sink.stats()["connections_opened"] == opened
    assert (bridge._kept is not None) == bool(keep)


def test_a_batch_after_a_longer_pause_opens_new_connections(
    three_batches, clock, smtp_sink, settings
):
    settings.REMINDERS_KEEP_CONNECTIONS = 10
    pipeline.deliver(three_batches[0], clock=clock)
    clock.advance(9)
    pipeline.deliver(three_batches[1], clock=clock)
    assert smtp_sink.stats()["connections_opened"] == 4
    clock.advance(
        11
    )  # idle longer than REMINDERS_KEEP_CONNECTIONS: the server may have dropped them
    pipeline.deliver(three_batches[2], clock=clock)
    assert smtp_sink.stats()["connections_opened"] == 8
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 30}


def test_changed_settings_get_a_new_session_and_the_old_one_is_closed(
    three_batches, clock, smtp_sink, settings
):
    from loopback.smtp_sink import SmtpSink

    pipeline.deliver(three_batches[0], clock=clock)
    first = bridge._kept.session
    with SmtpSink() as other:
        settings.EMAIL_PORT = other.port
        pipeline.deliver(three_batches[1], clock=clock)
        assert bridge._kept.session is not first
        assert len(other.received()) == 10  # not sent through the old connections
        bridge.close_kept_session()
    assert len(smtp_sink.received()) == 10
    assert first._thread is None  # closed when it was replaced


def test_a_batch_that_raises_closes_the_kept_session(three_batches, clock, monkeypatch):
    pipeline.deliver(three_batches[0], clock=clock)
    kept = bridge._kept.session

    def gone(**kwargs):
        raise RuntimeError("the record failed")

    monkeypatch.setattr(pipeline, "record_with_retry", gone)
    with pytest.raises(RuntimeError):
        pipeline.deliver(three_batches[1], clock=clock)
    assert bridge._kept is None and kept._thread is None


def test_a_session_inherited_across_a_fork_is_left_alone_and_replaced(
    three_batches, clock, monkeypatch
):
    """A forked child has the parent's object but not its loop thread: closing it would
    wait on a queue nothing reads."""
    pipeline.deliver(three_batches[0], clock=clock)
    inherited = bridge._kept
    monkeypatch.setattr(bridge.os, "getpid", lambda: inherited.pid + 1)
    pipeline.deliver(three_batches[1], clock=clock)
    assert bridge._kept is not inherited and inherited.session._thread is not None
    bridge._kept.session.close()
    bridge._kept = None
    inherited.session.close()


def test_the_pool_process_shutdown_hook_closes_the_kept_connections(
    three_batches, clock, smtp_sink
):
    from clock import SystemClock
    from config.celery import _close_kept_connections

    pipeline.deliver(three_batches[0], clock=clock)
    assert smtp_sink.open_connections == 4
    _close_kept_connections()
    assert bridge._kept is None
    real = SystemClock()  # the sink notices the QUITs on its own thread
    until = real.monotonic() + 2
    while smtp_sink.open_connections and real.monotonic() < until:
        real.sleep_blocking(0.01)
    assert smtp_sink.open_connections == 0
