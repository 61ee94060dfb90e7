"""The scan's own lane: a thread in every worker's main process that consumes the scan queue.

Delivery batches may keep every pool process busy for minutes, and a scan queued behind them
would expire unrun, so the pool consumes only delivery. A scan with another waiting behind it
is dropped (only the newest is worth running), judged by the queue, never by beat's clock.
"""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections, connections
from kombu import Queue
from kombu.exceptions import ChannelError

from reminders.schedule import SCAN_QUEUE, SCAN_TASK

logger = logging.getLogger(__name__)

# How long one wait for a message lasts before the lane checks whether to stop.
POLL_SECONDS = 1.0
# Pause before reconnecting after the broker went away.
RECONNECT_SECONDS = 2.0


class ScanLane:
    """Consume the scan queue in a daemon thread until ``stop``."""

    def __init__(self, app, *, hostname: str = "") -> None:
        self._app = app
        self._hostname = hostname
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reminders.scan-lane", daemon=True)
        self._thread.start()
        logger.info("Scan lane consuming queue %r", SCAN_QUEUE)

    def stop(self) -> None:
        """Stop taking scans, and return at once (a signal handler must not wait; ``join`` does)."""
        self._stopping.set()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a running scan to finish."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._consume()
                except Exception as exc:  # the broker went away: reconnect
                    logger.warning("Scan lane lost the broker (%s); reconnecting", exc)
                    self._stopping.wait(RECONNECT_SECONDS)
        finally:
            connections.close_all()

    def _consume(self) -> None:
        with self._app.connection_for_read() as connection:
            with connection.Consumer(
                [Queue(SCAN_QUEUE)],
                callbacks=[self._on_message],
                accept=["json"],
                prefetch_count=1,
            ):
                while not self._stopping.is_set():
                    try:
                        connection.drain_events(timeout=POLL_SECONDS)
                    except TimeoutError:
                        continue

    def _on_message(self, body, message) -> None:
        headers = message.headers or {}
        try:
            if headers.get("task") != SCAN_TASK:
                logger.error("Scan lane dropped a %r message", headers.get("task"))
            elif self._newer_waiting():
                logger.warning("Scan lane dropped a scan with a newer one waiting behind it")
            else:
                self._scan()
        finally:
            message.ack()

    def _newer_waiting(self) -> bool:
        """Return whether another scan message waits in the queue."""
        try:
            with self._app.connection_for_read() as connection:
                declared = connection.default_channel.queue_declare(queue=SCAN_QUEUE, passive=True)
        except ChannelError:  # not found: Redis keeps no empty list, so none waits
            return False
        except Exception as exc:  # cannot tell: run this one (a scan is idempotent)
            logger.warning("Scan lane could not count the scan queue (%s)", exc)
            return False
        return declared.message_count > 0

    def _scan(self) -> None:
        from reminders.worker import pipeline

        close_old_connections()
        try:
            pipeline.scan(worker=self._hostname)
        except Exception:
            logger.exception("Scan failed; the next one follows")
        finally:
            close_old_connections()


_lane: ScanLane | None = None


def start(app, *, hostname: str = "") -> None:
    """Start this process's lane (once)."""
    global _lane
    if _lane is None:
        _lane = ScanLane(app, hostname=hostname)
        _lane.start()


def stop() -> None:
    """Tell this process's lane to take no more scans (returns at once)."""
    if _lane is not None:
        _lane.stop()


def join(timeout: float = 30.0) -> None:
    """Wait for this process's lane to finish a running scan (up to ``timeout``)."""
    if _lane is not None:
        _lane.join(timeout)
