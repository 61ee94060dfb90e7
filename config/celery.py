"""The Celery application: ``celery -A config worker`` and ``celery -A config beat``.

Configuration comes from Django settings prefixed ``CELERY_`` (config/settings.py).
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import (
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("reminders")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _share_shutdown_flag(sender, **kwargs) -> None:
    """Create the warm-shutdown flag before the pool forks (reminders/shutdown.py)."""
    from reminders import shutdown

    shutdown.prepare()


@worker_init.connect
def _serve_metrics(sender, **kwargs) -> None:
    """Serve the worker's series when REMINDERS_METRICS_PORT is set (reminders/telemetry.py).

    Before the pool forks, so every pool process writes into the directory
    this process serves from.
    """
    from reminders import telemetry

    telemetry.start(getattr(sender, "hostname", "") or "")


@worker_init.connect
def _serve_as_worker(sender, **kwargs) -> None:
    """Give this process's database sessions, and its pool's, the worker's lock timeout."""
    from config import locks

    locks.serve_as_worker()


@worker_init.connect
def _load_before_fork(sender, **kwargs) -> None:
    """Import and compile what every pool process needs, then freeze it, before the fork.

    Pool processes then share those pages with the parent instead of each
    loading its own copy on the first batch; ``gc.freeze`` keeps the
    collector from writing to (and so copying) every object the parent made.
    """
    import gc

    import aiohttp  # noqa: F401  (the http channel's client)
    import aiosmtplib  # noqa: F401  (the smtp channel's client)
    import redis.asyncio  # noqa: F401  (the limiter imports it on first use)

    from reminders import content, pipeline  # noqa: F401  (the whole send path)

    content.warm_up()
    gc.collect()
    gc.freeze()


@worker_ready.connect
def _start_scan_lane(sender, **kwargs) -> None:
    """Run scans in the main process's own thread, never behind delivery (reminders/scanlane.py)."""
    from reminders import scanlane

    scanlane.start(app, hostname=getattr(sender, "hostname", "") or "")


@worker_shutting_down.connect
def _announce_shutdown(sender, **kwargs) -> None:
    """Stop running batches from starting new calls; they drain and record, then exit.

    Runs inside the main process's signal handler: it only sets flags.
    """
    from reminders import scanlane, shutdown

    shutdown.announce()
    scanlane.stop()


@worker_shutdown.connect
def _finish_scan(sender, **kwargs) -> None:
    """Let a scan that is running finish before the main process exits (up to 30 s)."""
    from reminders import scanlane

    scanlane.join()


@worker_process_shutdown.connect
def _close_kept_connections(**kwargs) -> None:
    """Close the pool process's kept provider connections as it exits (reminders/bridge.py)."""
    from reminders import bridge

    bridge.close_kept_session()
