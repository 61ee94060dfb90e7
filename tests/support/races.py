"""Run jobs in threads started together, each on its own database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

from django.db import connection, transaction

from clock import SystemClock

_real = SystemClock()


def race(*jobs, barrier_timeout: float = 10) -> list:
    """Run each job in its own thread and connection, started together; return their results.

    An exception raised by any job is re-raised in the caller's thread (as an
    assertion listing them all), so a race can never pass by losing one.
    """
    barrier = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(index, job):
        try:
            barrier.wait(barrier_timeout)
            results[index] = job()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return results


def after(seconds: float, job, **kwargs):
    """Return a job that waits ``seconds`` of real time, then calls ``job(**kwargs)``."""

    def run():
        SystemClock().sleep_blocking(seconds)
        return job(**kwargs)

    return run


class Step(threading.Thread):
    """Run ``job`` in a thread on its own connection; keep its result, error and backend pid."""

    def __init__(self, job: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.job = job
        self.pid: int | None = None
        self.started_job = threading.Event()
        self.result = self.error = None

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.started_job.set()
            self.result = self.job()
        except BaseException as exc:  # re-raised in the test's thread by finish()
            self.error = exc
        finally:
            self.started_job.set()
            connection.close()

    def finish(self) -> object:
        self.join(30)
        assert not self.is_alive(), "the step did not finish within 30 s"
        if self.error is not None:
            raise self.error
        return self.result


def blocked_or_done(step: Step) -> None:
    """Return once ``step`` waits on a lock in PostgreSQL, or has finished."""
    step.started_job.wait(10)
    give_up = _real.monotonic() + 20
    while step.is_alive():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                [step.pid],
            )
            if cursor.fetchone():
                return
        assert _real.monotonic() < give_up, "the step neither blocked nor finished"
        _real.sleep_blocking(0.01)


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    give_up = _real.monotonic() + timeout
    while not predicate():
        assert _real.monotonic() < give_up, f"timed out after {timeout} s waiting for {what}"
        _real.sleep_blocking(0.05)


@contextmanager
def held_rows(queryset):
    """Hold ``queryset``'s rows FOR UPDATE in another session until the block ends.

    Yield a function telling whether the lock is still held.
    """
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(queryset.select_for_update())
                held.set()
                release.wait(60)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        yield lambda: not release.is_set()
    finally:
        release.set()
        thread.join(60)


@contextmanager
def interrupted_while_it_waits(table: str, row_id: int, containing: str, interruption):
    """Interrupt the first statement containing ``containing`` while it waits for ``row_id`` of
    ``table``, which another transaction holds, and let the server finish (and so commit) it
    0.3 s later, after Django moved to a new connection: a soft time limit landing in a claim
    whose statement still commits. The block runs with that in place; it ends once the late
    statement has."""
    import psycopg

    params = connection.get_connection_params()
    holder = psycopg.connect(**params)
    holder.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [row_id])
    late: list[threading.Thread] = []

    def interrupt(execute, sql, sql_params, many, context):
        if late or containing not in sql:
            return execute(sql, sql_params, many, context)
        # Django gets another connection; the statement's stays open, waiting for the held
        # row, and ends when the holder commits.
        waiting = context["cursor"].cursor
        connection.connection = connection.get_new_connection(params)
        backend = waiting.connection.info.backend_pid

        def finish_later() -> None:
            waiting.execute(sql, sql_params)
            waiting.connection.close()

        late.append(threading.Thread(target=finish_later))
        late[0].start()
        with psycopg.connect(**params, autocommit=True) as watcher:
            while not watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                [backend],
            ).fetchone():
                _real.sleep_blocking(0.01)
        threading.Timer(0.3, holder.commit).start()
        raise interruption()

    try:
        with connection.execute_wrapper(interrupt):
            yield
    finally:
        if late:
            late[0].join(10)
        holder.close()
    assert late, f"no statement containing {containing!r} ran"


@contextmanager
def after_the_first_read(model, job):
    """Within the block, run ``job`` in another thread, to its end, right after the first
    SELECT from ``model``'s table has its rows; yield the list its result goes into."""
    table = connection.ops.quote_name(model._meta.db_table)
    done: list = []

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not done and sql.startswith("SELECT") and f"FROM {table}" in sql:
            step = Step(job)
            step.start()
            done.append(step.finish())
        return result

    with connection.execute_wrapper(wrapper):
        yield done
