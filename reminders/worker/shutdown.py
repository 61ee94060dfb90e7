"""The worker's warm-shutdown flag, shared by the main process and its pool processes.

Celery tells only the main process of a SIGTERM; a batch reads the flag before every call.
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
