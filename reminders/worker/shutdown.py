"""The worker's warm-shutdown flag, shared by the main process and its pool processes.

Celery handles SIGTERM in the worker's main process, which stops taking
messages and waits for running tasks; its pool processes are not told. Left
alone, a running batch would go on starting calls until its budget ran out.
So the main process creates this flag before it forks the pool
(``worker_init``, config/celery.py) and sets it when shutdown begins
(``worker_shutting_down``); a batch reads it between chunks and, through the
engine's stop, before every call: no new call starts, calls in flight finish
within the drain, and the ids not yet claimed go back for the next scan.
"""

from __future__ import annotations

import multiprocessing

_flag = None


def prepare() -> None:
    """Create the flag; call in the main process before the pool forks."""
    global _flag
    if _flag is None:
        _flag = multiprocessing.get_context("fork").Event()


def announce() -> None:
    """Tell every process of this worker that a warm shutdown has begun."""
    if _flag is not None:
        _flag.set()


def flag():
    """Return the flag (``is_set()``), or None outside a worker (tests, management commands)."""
    return _flag
