"""pytest plugin for ``make mutate``: one test database per concurrent mutmut worker.

mutmut forks a fresh pytest session per mutant and runs two of them at once. With
``--reuse-db`` they would share one test database, and a transactional test in one
could see or flush the rows of the other. Each session here locks a free slot
(a file lock held until the process exits) and uses ``test_<name>_mut<slot>``, so
a slot's database is created once and reused by every later session in that slot.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

SLOTS = 8
_held = None  # the open lock file; closing it (process exit) frees the slot


def _lock_dir() -> Path:
    base = Path(os.environ.get("REMINDERS_VAR_DIR") or "var") / "mutmut-slots"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _take_slot() -> int:
    global _held
    for slot in range(SLOTS):
        handle = open(_lock_dir() / f"slot-{slot}.lock", "w")  # held for the life of the process
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _held = handle
        return slot
    raise RuntimeError(f"all {SLOTS} mutmut database slots are busy")


def slot_database(name: str, slot: int) -> str:
    return f"test_{name}_mut{slot}"


def pytest_sessionstart(session) -> None:
    global _held
    if _held is not None:  # a session forked from one that already took a slot
        _held.close()
        _held = None
    from django.conf import settings

    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = slot_database(db["NAME"], _take_slot())
