"""The worker's signal handlers, connected when config/celery.py imports this module.

Each handler imports what it needs when it runs, so loading the Celery app loads no model.
"""

from __future__ import annotations

from celery.signals import (
    task_prerun,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)


@worker_init.connect
def prepare_main_process(sender, **kwargs) -> None:
    """Set up the shutdown flag, metrics, lock timeouts and a warm send path before the fork."""
    from reminders import locks
    from reminders.worker import shutdown, telemetry

    check_send_path()
    shutdown.prepare()
    telemetry.start(getattr(sender, "hostname", "") or "")
    locks.serve_as_worker()
    warm_send_path()


def check_send_path() -> None:
    """Stop the worker, saying why, when its channel cannot be built.

    The system check that says so (reminders.checks) is skipped in a worker (config/celery.py);
    without this, every batch would fail at its first send until its reminders were missed.
    """
    from clock import default_clock
    from reminders.worker import bridge

    if problem := bridge.channel_problem(clock=default_clock()):
        raise SystemExit(problem)


def warm_send_path() -> None:
    """Load the send path in a main process before it forks, so pool processes share it.

    ``gc.freeze`` keeps the collector from copying the shared pages.
    """
    import gc

    import aiohttp  # noqa: F401  (the http channel's client)
    import aiosmtplib  # noqa: F401  (the smtp channel's client)
    import redis.asyncio  # noqa: F401  (the limiter's client)

    from reminders import content
    from reminders.worker import pipeline  # noqa: F401  (the send path)

    content.warm_up()
    gc.collect()
    gc.freeze()


@task_prerun.connect
def reuse_database_connection(sender=None, **kwargs) -> None:
    """Keep a pool process's database session from task to task, as Django keeps a web
    process's (Celery's fix-up would open one per batch; CELERY_DB_REUSE_MAX stops it)."""
    from django.db import close_old_connections

    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


@worker_ready.connect
def start_scan_lane(sender, **kwargs) -> None:
    """Run scans in a thread of the main process, never behind delivery (scanlane.py)."""
    from reminders.worker import scanlane

    scanlane.start(sender.app, hostname=getattr(sender, "hostname", "") or "")


@worker_shutting_down.connect
def announce_shutdown(sender, **kwargs) -> None:
    """Stop running batches starting new calls; only sets flags, as it runs in a signal handler."""
    from reminders.worker import scanlane, shutdown

    shutdown.announce()
    scanlane.stop()


@worker_shutdown.connect
def finish_scan(sender, **kwargs) -> None:
    """Let a running scan finish before the main process exits (up to 30 s)."""
    from reminders.worker import scanlane

    scanlane.join()


@worker_process_shutdown.connect
def close_kept_connections(**kwargs) -> None:
    """Close a pool process's kept provider connections as it exits (bridge.py)."""
    from reminders.worker import bridge

    bridge.close_kept_session()
