"""The effective Celery configuration, read from the app: a misspelt setting cannot pass."""

import inspect
import math

from django.conf import settings

from config.celery import app


def test_effective_celery_configuration():
    conf = app.conf
    budget = settings.REMINDERS_BATCH_BUDGET
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is False
    assert conf.worker_prefetch_multiplier == 1
    bounds = settings.REMINDERS_TIME_BOUNDS
    longest = budget + settings.REMINDERS_CALL_TIMEOUT  # the budget, then the drain
    assert bounds.work >= longest
    # The values Celery sees are the derived ones (config/timing.py), rounded up.
    assert conf.task_soft_time_limit == math.ceil(bounds.soft_limit)
    assert conf.task_time_limit == math.ceil(bounds.hard_limit)
    assert settings.REMINDERS_LEASE_SECONDS == math.ceil(bounds.lease)
    assert longest < conf.task_soft_time_limit < conf.task_time_limit
    assert conf.task_time_limit < settings.REMINDERS_LEASE_SECONDS
    assert conf.worker_soft_shutdown_timeout >= bounds.stop_grace
    assert conf.beat_scheduler == "reminders.beat:ScanScheduler"
    assert conf.timezone == "UTC"
    assert conf.enable_utc is True
    assert conf.task_serializer == "json"
    assert conf.accept_content == ["json"]
    assert conf.task_ignore_result is True
    assert conf.task_publish_retry_policy["max_retries"] == 2
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit


def test_no_celery_setting_is_misspelt():
    """Every CELERY_* Django setting maps onto a key Celery knows, or one its Django fix-up
    reads by its full name."""
    import celery.fixups.django

    fixup = inspect.getsource(celery.fixups.django)
    known = set(app.conf.keys())
    names = [name for name in dir(settings) if name.startswith("CELERY_")]
    unknown = [
        name
        for name in names
        if name.removeprefix("CELERY_").lower() not in known and f"'{name}'" not in fixup
    ]
    assert names
    assert unknown == []


def test_task_names_and_routes_are_explicit():
    app.loader.import_default_modules()
    names = {"reminders.deliver_batch", "reminders.replay_selection", "reminders.send_test"}
    assert names <= set(app.tasks)
    assert "reminders.scan" not in app.tasks  # the scan lane consumes its queue, not the pool
    assert app.conf.task_routes["reminders.scan"] == {"queue": "scan"}


def test_a_worker_with_no_flags_consumes_every_queue():
    """`celery -A config worker` with no -Q: the pool takes delivery, the scan lane the scan.

    The pool must not consume the scan queue (busy delivery processes would
    starve it); the main process's scan lane does (reminders/worker/scanlane.py)."""
    from reminders.worker.scanlane import SCAN_QUEUE

    consumed = set(app.amqp.queues.consume_from or app.amqp.queues)
    routed = {route["queue"] for route in app.conf.task_routes.values()}
    assert consumed == {"reminders"} == {app.conf.task_default_queue}
    assert routed == consumed | {SCAN_QUEUE}


def test_beat_records_every_scan_it_sends():
    """The health view reads last_run_at; beat must write it after each scan."""
    assert app.conf.beat_sync_every == 1
