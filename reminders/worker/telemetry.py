"""A worker's own series for Prometheus: provider calls, slack before the deadline, limiter waits.

Off unless ``REMINDERS_METRICS_PORT`` is set. Each pool process writes its counts to a file of
its own in a directory the worker owns, and the main process serves their sum. The series'
names are a contract (deploy/prometheus/alerts.yml, docs/operations.md).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from django.conf import settings

from delivery.observer import CALL_OUTCOMES

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Seconds: call buckets span the provider's usual answer to the call timeout; slack
# buckets span the cutoff alert's 5 minutes to the lead.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SLACK_BUCKETS = (
    60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0,
    43200.0, 86400.0, 172800.0,
)  # fmt: skip
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_observer: WorkerObserver | None = None
# The open lock file that makes the metrics directory this worker's alone (see _own).
_owned = None


class WorkerObserver:
    """The engine's observer, counting into prometheus-client; it never waits on I/O."""

    def __init__(self, *, registry=None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        registry = REGISTRY if registry is None else registry

        self.calls = Counter(
            "reminders_provider_calls",
            "Provider calls, by channel, how each call ended, and message kind",
            ["channel", "outcome", "kind"],
            registry=registry,
        )
        self.call_seconds = Histogram(
            "reminders_provider_call_seconds",
            "How long each provider call took",
            ["channel"],
            buckets=CALL_BUCKETS,
            registry=registry,
        )
        self.slack = Histogram(
            "reminders_send_slack_seconds",
            "How long before its deadline (a reminder's cutoff, a notice's start) each accepted "
            "message was accepted",
            ["channel", "kind"],
            buckets=SLACK_BUCKETS,
            registry=registry,
        )
        self.limiter_wait = Histogram(
            "reminders_limiter_wait_seconds",
            "Each wait for the rate limiter's grant to start a provider call",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        # labels() takes a lock and builds a key: resolve each child once.
        self._children: dict[tuple, object] = {}

    def _child(self, metric, *labels: str):
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[metric, labels] = metric.labels(*labels)
        return child

    def call_ended(self, channel: str, outcome: str, seconds: float, kind: str) -> None:
        """Count one call and its duration."""
        self._child(self.calls, channel, outcome, kind).inc()
        self._child(self.call_seconds, channel).observe(seconds)

    def sent(self, channel: str, slack_seconds: float, kind: str) -> None:
        """Note how far before its deadline an accepted message went out."""
        self._child(self.slack, channel, kind).observe(slack_seconds)

    def limiter_waited(self, seconds: float) -> None:
        """Note one wait for the limiter."""
        self.limiter_wait.observe(seconds)

    def declare(self, channel: str) -> None:
        """Expose every outcome of ``channel`` at zero, so a rate over it has a start."""
        for kind in ("reminder", "notice"):
            for outcome in CALL_OUTCOMES:
                self._child(self.calls, channel, outcome, kind)
            self._child(self.slack, channel, kind)
        self._child(self.call_seconds, channel)


def observer() -> WorkerObserver | None:
    """Return this worker's observer, or None when REMINDERS_METRICS_PORT is unset."""
    return _observer


def start(nodename: str) -> Path | None:
    """Serve this worker's series; return the directory, or None. Call before the pool forks.

    Raise ``SystemExit`` when the port cannot be bound (Celery would go on without metrics).
    """
    global _observer
    port = settings.REMINDERS_METRICS_PORT
    if not port:
        return None
    # One directory per worker for its processes' files.
    safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", nodename) or "worker"
    directory = Path(os.environ.get(MULTIPROC_ENV) or Path(settings.VAR_DIR) / "metrics" / safe)
    # Celery logs any other error of a worker_init handler and starts the worker without the
    # rest of it (the port, lock timeouts): stop instead, saying why.
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _own(directory, nodename)
        # Files left by an earlier run would be summed into this one's totals.
        for leftover in directory.glob("*.db"):
            leftover.unlink(missing_ok=True)
    except OSError as exc:
        raise SystemExit(
            f"REMINDERS_METRICS_PORT={port}: the worker cannot write its metrics directory "
            f"{directory} ({exc.strerror or exc}): give it a REMINDERS_VAR_DIR it may write, "
            "or unset REMINDERS_METRICS_PORT."
        ) from exc
    os.environ[MULTIPROC_ENV] = str(directory)

    from prometheus_client import CollectorRegistry, start_http_server, values
    from prometheus_client.multiprocess import MultiProcessCollector

    # prometheus-client picked its value class at import, before the directory was
    # set (Flower's plugin imports it): pick again, so counts go to the mapped files.
    values.ValueClass = values.get_value_class()

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    bind = settings.REMINDERS_METRICS_BIND
    try:
        start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        raise SystemExit(
            f"REMINDERS_METRICS_PORT={port} on {bind} cannot be served ({exc.strerror or exc}): "
            "give each worker on a host its own port, or unset REMINDERS_METRICS_PORT."
        ) from exc
    _observer = WorkerObserver()
    _observer.declare(settings.REMINDERS_CHANNEL)
    logger.info("Worker metrics on http://%s:%d/metrics from %s", bind, port, directory)
    return directory


def _own(directory: Path, nodename: str) -> None:
    """Hold ``directory`` for this worker (its pool processes inherit the lock) until it exits.

    Raise ``SystemExit`` when another live worker holds it: two workers of one name on a host
    share the directory, and emptying it would lose the other's counts, or serving it would
    count them twice.
    """
    global _owned
    import fcntl

    handle = (directory / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise SystemExit(
            f"Another worker on this host keeps its metrics in {directory} (a worker named "
            f"{nodename!r}, or {MULTIPROC_ENV} naming the same directory): give each worker "
            "on a host its own --hostname (-n worker2@%h)."
        ) from None
    _owned = handle
