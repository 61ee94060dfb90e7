"""The chaos run's lock report (bench.chaos.lock_report) reads what a real PostgreSQL logs:
a lock waited on for over a second and a deadlock, on a private cluster set up as the
chaos run's (bench.harness.PrivatePostgres, log_lock_waits on)."""

from __future__ import annotations

import shutil
import threading

import psycopg
import pytest

from bench.chaos import lock_report
from bench.harness import PrivatePostgres, make_workdir
from clock import SystemClock

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def cluster():
    workdir = make_workdir("lock-report-")
    postgres = PrivatePostgres(workdir / "pg", durable=False)
    try:
        postgres.init()
        postgres.start()
        postgres.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
        postgres.execute("INSERT INTO t VALUES (1, 0), (2, 0)")
        yield postgres
    finally:
        postgres.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _connect(postgres):
    return psycopg.connect(postgres.url("postgres"), connect_timeout=10)


def test_a_quiet_cluster_reports_nothing(cluster):
    assert lock_report(cluster.log) == {"deadlocks": 0, "waits_over_1s": 0, "first": []}


def test_a_long_lock_wait_and_a_deadlock_are_counted(cluster):
    clock = SystemClock()
    holder, waiter = _connect(cluster), _connect(cluster)
    with holder, waiter:
        # A wait of over a second (deadlock_timeout): logged by log_lock_waits.
        holder.execute("UPDATE t SET n = n + 1 WHERE id = 1")
        blocked = threading.Thread(
            target=lambda: waiter.execute("UPDATE t SET n = n + 1 WHERE id = 1")
        )
        blocked.start()
        clock.sleep_blocking(1.5)
        holder.commit()
        blocked.join(10)
        waiter.commit()
        # Two writers taking two rows in opposite orders: PostgreSQL ends one.
        holder.execute("UPDATE t SET n = n + 1 WHERE id = 1")
        waiter.execute("UPDATE t SET n = n + 1 WHERE id = 2")
        errors: list[BaseException] = []

        def second(connection, row: int) -> None:
            try:
                connection.execute("UPDATE t SET n = n + 1 WHERE id = %s", [row])
            except psycopg.errors.DeadlockDetected as exc:
                errors.append(exc)
            finally:
                connection.rollback()

        threads = [
            threading.Thread(target=second, args=(holder, 2)),
            threading.Thread(target=second, args=(waiter, 1)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert len(errors) == 1
    report = lock_report(cluster.log)
    assert report["deadlocks"] == 1
    assert report["waits_over_1s"] >= 1  # the first wait, and the deadlock's own waits
    assert any("deadlock detected" in line for line in report["first"])
    assert any("still waiting for" in line for line in report["first"])
