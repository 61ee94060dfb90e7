"""Run jobs in threads started together, each on its own database connection."""

from __future__ import annotations

import threading

from django.db import connection

from clock import SystemClock


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
