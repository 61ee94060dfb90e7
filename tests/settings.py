"""The test run's settings: config.settings, with each pytest-xdist worker on its own Redis
database and var directory.

pytest-django already gives each worker its own test database (``test_<name>_gw<N>``).
Worker gw<N> gets the broker's database number minus N and ``<var dir>/gw<N>``. The child
processes the tests start (workers, beats, ``manage.py``) inherit the result through the
environment; one that reads these settings again is no xdist worker and changes nothing.
"""

from __future__ import annotations

import os
import re
import sys


def _per_worker(worker: str) -> None:
    index = int(worker.removeprefix("gw"))
    for name in ("CELERY_BROKER_URL", "REMINDERS_REDIS_URL"):
        url = os.environ.get(name, "")
        match = re.fullmatch(r"(rediss?://[^/]+/)(\d+)", url)
        if match is None:
            continue
        number = int(match.group(2)) - index
        if number < 0:
            raise SystemExit(
                f"{name}={url} leaves no Redis database for xdist worker {worker}: point it "
                "at a higher database number (make test uses /15) or run fewer workers (-n)."
            )
        os.environ[name] = f"{match.group(1)}{number}"
    var_dir = os.environ.get("REMINDERS_VAR_DIR")
    if var_dir:
        os.environ["REMINDERS_VAR_DIR"] = os.path.join(var_dir, worker)


if os.environ.get("PYTEST_XDIST_WORKER") and "xdist" in sys.modules:
    _per_worker(os.environ["PYTEST_XDIST_WORKER"])

from config.settings import *  # noqa: E402, F403

# Django's default hasher spends a third of a second on each password by design; the tests
# make a staff user in most admin tests and prove nothing about hashing.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
