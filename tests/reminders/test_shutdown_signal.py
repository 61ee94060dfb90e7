"""The worker's shutdown signal handler sets flags and returns; the wait comes later."""

from __future__ import annotations

import threading

from reminders.worker import hooks, scanlane, shutdown


def test_the_shutdown_signal_returns_while_a_scan_runs_and_the_worker_shutdown_waits(
    monkeypatch,
):
    """Celery runs ``worker_shutting_down`` inside the main process's signal handler:
    waiting there for a running scan would hold up that process's acks and heartbeats."""
    scan_may_end = threading.Event()
    lane = scanlane.ScanLane(app=None)
    lane._thread = threading.Thread(target=scan_may_end.wait, args=(60,), daemon=True)
    lane._thread.start()  # a scan in progress
    monkeypatch.setattr(scanlane, "_lane", lane)
    monkeypatch.setattr(shutdown, "_flag", threading.Event())
    handler = threading.Thread(target=hooks.announce_shutdown, kwargs={"sender": None})
    handler.start()
    handler.join(10)
    try:
        assert not handler.is_alive(), "the signal handler waited for the running scan"
        assert shutdown.flag().is_set(), "running batches were not told to stop"
        assert lane._stopping.is_set(), "the lane was not told to take no more scans"
        assert lane._thread.is_alive()
        waiter = threading.Thread(target=hooks.finish_scan, kwargs={"sender": None})
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive(), "the worker's shutdown did not wait for the running scan"
    finally:
        scan_may_end.set()
    waiter.join(10)
    assert not waiter.is_alive() and not lane._thread.is_alive()
