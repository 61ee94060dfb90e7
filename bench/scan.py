"""Benchmark the scan against a naive per-workshop loop, on PostgreSQL (not a test).

    .venv/bin/python -m bench.scan                      # 100, 1,000 and 10,000 workshops
    .venv/bin/python -m bench.scan --sizes 100 1000     # smaller

For each size it seeds N workshops starting within the lead window, ten
enrollments each, then measures on the same data:

- the scan (``reminders.worker.pipeline.scan``: expire, reap, one-statement plan,
  set-based dispatch), with Django's query capture;
- a naive baseline: for each workshop, for each enrollment, ``get_or_create``
  the reminder, then mark each due one queued and publish it alone.

Then the claim and the record of two delivery batches of 100 reminders, in
queries per reminder: the first also stores the text its reminders are
frozen with; the second, the steady state the target is about, finds it. Uses its own database (``reminders_bench`` unless
BENCH_DATABASE_URL says otherwise), created if missing and emptied per size.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import timedelta

BENCH_DB = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/reminders_bench"
)
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-0a1b2c3d4e5f6a7b8c9d0e1f2a")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")


def _ensure_database() -> None:
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(BENCH_DB)
    with psycopg.connect(
        host=config["HOST"] or "127.0.0.1",
        port=config["PORT"] or 5432,
        user=config["USER"] or "postgres",
        password=config["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        exists = admin.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (config["NAME"],)
        ).fetchone()
        if not exists:
            admin.execute(f'CREATE DATABASE "{config["NAME"]}"')


class QueryCounter:
    """Count every statement sent to the database (no cap, unlike the debug query log)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        if not sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT")):
            self.count += 1
        return execute(sql, params, many, context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--per-workshop", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)

    _ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return _run(args)


def _run(args) -> int:
    from django.conf import settings
    from django.db import connection, transaction

    from clock import FakeClock, SystemClock
    from reminders.models import Reminder
    from reminders.policy import ReminderPolicy
    from reminders.services import reminder_claim_batch, reminder_record_batch
    from reminders.services.dispatch import ROWS_PER_TRANSACTION, STATEMENTS_PER_TRANSACTION
    from reminders.worker import pipeline
    from workshops.models import Attendee, Enrollment, Workshop

    real = SystemClock()
    clock = FakeClock(real.now(), autojump=False)
    policy = ReminderPolicy.from_settings()

    def reset() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE reminders_deliveryattempt, reminders_reminder, reminders_scanrun, "
                "workshops_enrollment, "
                "workshops_attendee, workshops_workshop RESTART IDENTITY CASCADE"
            )

    def seed(size: int) -> None:
        reset()
        now = clock.now()
        workshops = Workshop.objects.bulk_create(
            Workshop(
                title=f"Bench {i}",
                starts_at=now + timedelta(hours=1, minutes=i % 600),
                ends_at=now + timedelta(hours=2, minutes=i % 600),
                timezone="Europe/Berlin",
            )
            for i in range(size)
        )
        people = Attendee.objects.bulk_create(
            Attendee(name=f"P{i}", email=f"p{i}@example.com") for i in range(1000)
        )
        Enrollment.objects.bulk_create(
            (
                Enrollment(attendee=people[(w * 7 + k) % len(people)], workshop=workshop)
                for w, workshop in enumerate(workshops)
                for k in range(args.per_workshop)
            ),
            batch_size=5000,
        )

    def naive_scan() -> int:
        published = 0
        now = clock.now()
        for workshop in Workshop.objects.filter(
            status="scheduled", starts_at__gt=now, starts_at__lte=now + policy.lead
        ):
            for enrollment in workshop.enrollments.filter(status="active"):
                reminder, _ = Reminder.objects.get_or_create(
                    attendee_id=enrollment.attendee_id,
                    workshop=workshop,
                    defaults={
                        "enrollment": enrollment,
                        "key": f"naive-w{workshop.pk}-a{enrollment.attendee_id}",
                    },
                )
                if reminder.status == "pending":
                    reminder.status = "queued"
                    reminder.queued_until = policy.deadline_at(workshop.starts_at)
                    reminder.save(update_fields=["status", "queued_until"])
                    published += 1  # one broker message per reminder
        return published

    def scan_into(messages: list[int]):
        """Return a scan job that counts broker messages instead of publishing them."""
        return lambda: pipeline.scan(clock=clock, publish=lambda ids: messages.append(len(ids)))

    def measure(job, *, atomic: bool):
        counter = QueryCounter()
        with connection.execute_wrapper(counter):
            started = real.monotonic()
            if atomic:
                with transaction.atomic():
                    outcome = job()
            else:
                outcome = job()
            elapsed = real.monotonic() - started
        return outcome, counter.count, elapsed

    def fixed(queries: int, dispatched: int) -> int:
        """The statements beyond the dispatch's own per transaction (dispatch.py)."""
        batch = settings.REMINDERS_BATCH_SIZE
        per_transaction = max(batch, ROWS_PER_TRANSACTION // batch * batch)
        return queries - STATEMENTS_PER_TRANSACTION * math.ceil(dispatched / per_transaction)

    print(f"scan benchmark on PostgreSQL, {args.per_workshop} enrollments per workshop")
    print(
        f"{'workshops':>9} {'reminders':>9} | {'scan q':>6} {'scan s':>7} {'msgs':>5} | "
        f"{'naive q':>8} {'naive s':>8} {'msgs':>6} | {'speed-up':>8}"
    )
    rows = []
    for size in args.sizes:
        seed(size)
        messages: list[int] = []
        # The scan as the scan lane runs it: each step in its own transactions.
        counts, scan_queries, scan_time = measure(scan_into(messages), atomic=False)
        reminders = counts["planned"]
        seed(size)
        naive_messages, naive_queries, naive_time = measure(naive_scan, atomic=True)
        speedup = naive_time / scan_time
        rows.append((size, fixed(scan_queries, counts["dispatched"]), speedup))
        print(
            f"{size:>9} {reminders:>9} | {scan_queries:>6} {scan_time:>7.3f} {len(messages):>5} | "
            f"{naive_queries:>8} {naive_time:>8.2f} {naive_messages:>6} | {speedup:>7.1f}x"
        )

    # Two delivery batches: claim and record cost per reminder. The first
    # also stores the frozen text its reminders share; the second finds it.
    seed(max(1, 2 * args.batch // args.per_workshop))
    pipeline.scan(clock=clock, publish=lambda ids: None)
    ids = list(Reminder.objects.values_list("id", flat=True)[: 2 * args.batch])
    from delivery.results import DeliveryResult, Outcome

    statements = []
    for chunk in (ids[: args.batch], ids[args.batch :]):
        counter = QueryCounter()
        with connection.execute_wrapper(counter):
            claim = reminder_claim_batch(ids=chunk, channel="http", clock=clock)
            reminder_record_batch(
                claim=claim,
                results=[
                    DeliveryResult(
                        reminder_id=r.pk,
                        key=r.key,
                        outcome=Outcome.SENT,
                        message_id=f"m{r.pk}",
                        error="",
                        attempts=1,
                        provider_reached=True,
                        maybe_delivered=True,
                    )  # fmt: skip
                    for r in claim.reminders
                ],
                clock=clock,
            )
        statements.append(counter.count)
    per_reminder = statements[1] / len(ids[args.batch :])
    print(
        f"claim + record of a batch of {len(claim.reminders)}: {statements[1]} statements = "
        f"{per_reminder:.3f} queries per reminder ({statements[0]} for the first batch of a "
        "new text, which stores it)"
    )
    flat = len({q for _, q, _ in rows}) == 1
    largest = rows[-1]
    print(
        f"queries per scan beyond {STATEMENTS_PER_TRANSACTION} per dispatch transaction, "
        "constant across sizes: "
        f"{'yes' if flat else 'NO'} "
        f"({', '.join(str(q) for _, q, _ in rows)}); "
        f"speed-up at {largest[0]} workshops: {largest[2]:.1f}x (target >= 20x); "
        f"claim+record {per_reminder:.3f} q/reminder (target < 0.1)"
    )
    reset()
    return 0 if flat and per_reminder < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
