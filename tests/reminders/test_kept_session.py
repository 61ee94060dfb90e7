"""A pool process keeps its provider connections from batch to batch (REMINDERS_KEEP_CONNECTIONS)."""

from collections import Counter

import pytest

from reminders.models import Reminder
from reminders.worker import bridge, pipeline

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
    batches = [batch for batch in published]
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


def test_batches_in_two_threads_at_once_each_get_a_session_of_their_own(
    three_batches, clock, smtp_sink, settings
):
    """A session serves one thread at a time; a prefork pool process runs its tasks in its
    main thread, but a batch run from any other thread (a thread pool) must not share it."""
    import threading

    from django.db import connection

    settings.REMINDERS_KEEP_CONNECTIONS = 10
    entered, results = threading.Barrier(2, timeout=10), []

    def batch(ids) -> None:
        try:
            with bridge.delivery_session(channel="smtp", clock=clock) as session:
                entered.wait()  # both inside at once
                results.append(session)
            results.append(pipeline.deliver(ids, clock=clock)["sent"])
        finally:
            connection.close()

    threads = [threading.Thread(target=batch, args=(ids,)) for ids in three_batches[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    sessions = [item for item in results if not isinstance(item, int)]
    assert len(sessions) == 2 and sessions[0] is not sessions[1]
    assert sorted(item for item in results if isinstance(item, int)) == [10, 10]
    assert bridge._kept is None  # nothing kept from another thread


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
    from reminders.worker.hooks import close_kept_connections

    pipeline.deliver(three_batches[0], clock=clock)
    assert smtp_sink.open_connections == 4
    close_kept_connections()
    assert bridge._kept is None
    real = SystemClock()  # the sink notices the QUITs on its own thread
    until = real.monotonic() + 2
    while smtp_sink.open_connections and real.monotonic() < until:
        real.sleep_blocking(0.01)
    assert smtp_sink.open_connections == 0


@pytest.fixture
def http_batches(live_clock, due_reminders, published, settings):
    """Two batches of 8 for the http channel, delivered on the real clock: the engine's
    retry after a lost connection waits for real."""
    from clock import SystemClock
    from loopback.http_sink import HttpSink

    with HttpSink() as sink:  # no signature check: the rows were planned on the fake clock
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL = sink.url
        settings.REMINDERS_HTTP_SECRET = "s3cret"
        settings.REMINDERS_CONCURRENCY = 4
        settings.REMINDERS_BATCH_SIZE = 8
        settings.REMINDERS_KEEP_CONNECTIONS = 10
        due_reminders(16)
        pipeline.scan(clock=live_clock)
        batches = [batch for batch in published]
        assert [len(batch) for batch in batches] == [8, 8]
        yield sink, batches, SystemClock()


def test_kept_http_connections_the_provider_closed_while_idle_are_replaced(http_batches):
    """B7 on http: between two batches the provider closes every kept keep-alive
    connection; the next batch opens new ones and sends each reminder with one call."""
    from reminders.models import DeliveryAttempt

    sink, batches, clock = http_batches
    assert pipeline.deliver(batches[0], clock=clock)["sent"] == 8
    opened = sink.stats()["connections_opened"]
    assert sink.drop_connections() == opened  # all of them were still open, idle
    assert pipeline.deliver(batches[1], clock=clock)["sent"] == 8
    stats = sink.stats()
    assert stats["connections_opened"] > opened
    assert (stats["requests"], stats["accepted"], stats["duplicates"]) == (16, 16, 0)
    assert set(DeliveryAttempt.objects.values_list("provider_calls", flat=True)) == {1}


def test_a_kept_http_connection_closed_under_a_request_is_retried_under_its_key(http_batches):
    """B7 on http, the race: the provider closes a kept connection just as a request
    goes out on it, without acting on it. The engine retries under the same key
    and the reminder is sent once."""
    from loopback.http_sink import CLOSE
    from reminders.models import DeliveryAttempt

    sink, batches, clock = http_batches
    assert pipeline.deliver(batches[0], clock=clock)["sent"] == 8
    opened = sink.stats()["connections_opened"]
    victim = Reminder.objects.get(pk=batches[1][0])
    sink.script(victim.key, CLOSE)
    assert pipeline.deliver(batches[1], clock=clock)["sent"] == 8
    assert [r.status for r in sink.requests_for(victim.key)] == [CLOSE, 200]
    assert sink.stats()["duplicates"] == 0
    assert sink.stats()["connections_opened"] == opened + 1  # only the closed one replaced
    assert DeliveryAttempt.objects.get(reminder=victim).provider_calls == 2
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 16}
