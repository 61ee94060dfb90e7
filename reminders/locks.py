"""How long this process's database sessions wait for a row lock, and what staff see then.

Every PostgreSQL session sets ``lock_timeout`` on connect, so neither workers nor staff wait
unbounded behind each other (REMINDERS_WORKER_LOCK_TIMEOUT, else REMINDERS_STAFF_LOCK_TIMEOUT).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib import messages
from django.db import OperationalError
from django.http import HttpResponseRedirect
from django.utils.deprecation import MiddlewareMixin

logger = logging.getLogger(__name__)

_role = {"worker": False}


def serve_as_worker() -> None:
    """Mark this process (and the pool it forks) as a worker's."""
    _role["worker"] = True


def on_connection_created(sender, connection, **kwargs) -> None:
    """Set the session's ``lock_timeout`` (Django's ``connection_created`` signal)."""
    if connection.vendor != "postgresql":
        return
    if _role["worker"]:
        seconds = settings.REMINDERS_WORKER_LOCK_TIMEOUT
    else:
        seconds = settings.REMINDERS_STAFF_LOCK_TIMEOUT
    milliseconds = max(1, round(seconds * 1000))
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{milliseconds}ms"])


def _sqlstate_in(exc: BaseException, codes: set[str]) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "sqlstate", None) in codes:
            return True
        seen = seen.__cause__
    return False


def lock_not_available(exc: BaseException) -> bool:
    """Return whether ``exc`` is PostgreSQL giving up on a lock (SQLSTATE 55P03)."""
    return _sqlstate_in(exc, {"55P03"})


def lost_a_race(exc: BaseException) -> bool:
    """Return whether ``exc`` is PostgreSQL ending a transaction that lost to a concurrent one
    (deadlock 40P01, serialization failure 40001): running it again is safe."""
    return _sqlstate_in(exc, {"40P01", "40001"})


def read_only(exc: BaseException) -> bool:
    """Return whether ``exc`` is PostgreSQL refusing a write in a read-only session (25006: a
    standby, as during a failover)."""
    return _sqlstate_in(exc, {"25006"})


def gave_up_waiting(exc: BaseException) -> bool:
    """Return whether ``exc`` is a lock or statement timeout firing (55P03, 57014)."""
    return _sqlstate_in(exc, {"55P03", "57014"})


BUSY_MESSAGE = (
    "Another change to the same workshops or reminders is being written right now, so "
    "nothing was changed. Try again in a few seconds."
)


class LockBusyMiddleware(MiddlewareMixin):
    """Send a request that gave up waiting for a row lock back to its page with BUSY_MESSAGE."""

    def process_exception(self, request, exception):
        if not (isinstance(exception, OperationalError) and lock_not_available(exception)):
            return None
        logger.warning("A request gave up waiting for a row lock: %s", request.path)
        messages.error(request, BUSY_MESSAGE)
        return HttpResponseRedirect(request.get_full_path())
