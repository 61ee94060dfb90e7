"""A worker whose delivery channel cannot be built stops at start, saying why.

The system checks that would say so (reminders.E001) are skipped in a worker
(config/celery.py), and web never runs them: without this, the worker came up,
took every batch and failed each one at its first send, until the reminders were missed.
"""

from __future__ import annotations

import pytest

from clock import SystemClock
from tests.support.processes import Proc, process_env, worker_argv

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
_clock = SystemClock()


def test_a_worker_whose_channel_cannot_be_built_exits_and_says_why(tmp_path):
    env = process_env(
        REMINDERS_VAR_DIR=str(tmp_path),
        REMINDERS_CHANNEL="http",
        # Plain http to another machine, without REMINDERS_HTTP_ALLOW_INSECURE.
        REMINDERS_HTTP_URL="http://provider.example.com/reminders",
        REMINDERS_HTTP_SECRET="worker-start-test-secret-0a1b2c3d4e5f",
    )
    env.pop("REMINDERS_HTTP_ALLOW_INSECURE", None)
    worker = Proc(worker_argv(name="unbuildable"), env, "unbuildable")
    try:
        deadline = _clock.monotonic() + 60
        while not worker.ready and worker.popen.poll() is None and _clock.monotonic() < deadline:
            _clock.sleep_blocking(0.1)
        code = worker.popen.poll()
    finally:
        worker.stop()
    assert not worker.ready, f"the worker started:\n{worker.output()}"
    assert code not in (None, 0), worker.output()
    assert "REMINDERS_CHANNEL=http cannot be built" in worker.output()
    assert "REMINDERS_HTTP_ALLOW_INSECURE=1" in worker.output()
