"""The database layer alone: claim, render and record through an instant channel (not a test).

    .venv/bin/python -m bench.dblayer                          # 20,000 reminders, 1, 2 and 4 processes
    .venv/bin/python -m bench.dblayer --reminders 4000 --processes 1 2

It tells an operator how many reminders per second PostgreSQL and the
workers' own code carry before the provider becomes the limit. A private
PostgreSQL cluster (bench.harness) holds ``--reminders`` due reminders; P
forked processes each run ``reminders.worker.pipeline.deliver`` on their share of
the batches of ``REMINDERS_BATCH_SIZE`` ids, exactly as a pool process
does (claim with its guarded UPDATE, envelopes, the claim watch's first
read, the engine, the fenced record), but the channel answers at once in
the same process and there is no rate limiter. Measured for P = 1, 2 and 4:

- reminders per second, from the start of the first process to the end of
  the last;
- CPU per reminder in the workers and in their PostgreSQL backends (each
  process reads its backend's /proc entry before it disconnects).

The baseline, same run, same processes, same rows (reset to ``pending``):
one reminder at a time, as a careful per-reminder task would write it (lock
and load the row with its attendee and workshop, mark it ``sending``, build
its envelope, "send", mark it ``sent`` and insert its attempt, one
transaction each).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import uuid
from datetime import timedelta

from bench.harness import CLOCK, django_on_private_postgres, run_program, save_results, saveable

DATABASE = "bench_dblayer"
TARGET_RATE = 5000
START_TIMEOUT = 300  # seconds a forked process waits for the others, and the driver, to start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dblayer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reminders", type=int, default=20_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--per-workshop", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    parser.add_argument(
        "--save",
        action="store_true",
        help="write the figures to bench/results/dblayer-COMMIT.json (refused from a changed tree)",
    )
    args = parser.parse_args(argv)
    started = saveable("dblayer") if args.save else None

    with django_on_private_postgres("dblayer-", DATABASE, keep=args.keep, REMINDERS_RATE_LIMIT="0"):
        ids = _seed(args)
        print(
            f"database layer on a private PostgreSQL: {len(ids)} due reminders, batches of "
            f"{_batch_size()}, an instant channel in the worker process, {os.cpu_count()} CPUs"
        )
        rows = []
        for processes in args.processes:
            _reset(ids)
            product = _run(ids, processes, _product_worker)
            _reset(ids)
            baseline = _run(ids, processes, _baseline_worker)
            rows.append((processes, product, baseline))
    code, summary = _report(rows)
    if args.save:
        figures = {
            "bench": "dblayer",
            **started,
            "settings": {
                "reminders": args.reminders,
                "batch_size": summary.pop("batch_size"),
                "command": "python -m bench.dblayer --save",
            },
            "figures": summary,
        }
        print(f"saved to {save_results('dblayer', figures)}")
    return code


def _batch_size() -> int:
    from django.conf import settings

    return settings.REMINDERS_BATCH_SIZE


def _seed(args) -> list[int]:
    from django.db import connection

    from clock import FakeClock
    from reminders.services import reminders_plan
    from workshops.models import Attendee, Enrollment, Workshop

    now = CLOCK.now()
    count = math.ceil(args.reminders / args.per_workshop)
    workshops = Workshop.objects.bulk_create(
        Workshop(
            title=f"DB layer workshop {i}",
            starts_at=now + timedelta(hours=2) + i * timedelta(hours=18) / count,
            ends_at=now + timedelta(hours=3) + i * timedelta(hours=18) / count,
            timezone=("Europe/Berlin", "America/New_York", "Asia/Tokyo")[i % 3],
        )
        for i in range(count)
    )
    people = Attendee.objects.bulk_create(
        Attendee(name=f"Person {i}", email=f"person{i}@example.com")
        for i in range(max(args.per_workshop, args.reminders // 4))
    )
    left, enrollments = args.reminders, []
    for index, workshop in enumerate(workshops):
        take = min(args.per_workshop, left)
        enrollments += [
            Enrollment(attendee=people[(index * 7 + k) % len(people)], workshop=workshop)
            for k in range(take)
        ]
        left -= take
    Enrollment.objects.bulk_create(enrollments, batch_size=5000)
    reminders_plan(clock=FakeClock(now, autojump=False))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.id FROM reminders_reminder r JOIN workshops_workshop w "
            "ON w.id = r.workshop_id ORDER BY w.starts_at, r.id"
        )
        ids = [row[0] for row in cursor.fetchall()]
    connection.close()
    return ids


def _reset(ids: list[int]) -> None:
    """Bring every reminder back to ``pending``, with no attempts, and vacuum the tables."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE reminders_deliveryattempt")
        cursor.execute(
            "UPDATE reminders_reminder SET status = 'pending', claim_token = NULL, "
            "lease_expires_at = NULL, attempts = 0, sent_at = NULL, provider_message_id = '', "
            "status_reason = '', last_error = '', next_attempt_at = NULL, queued_until = NULL"
        )
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE reminders_reminder")
        cursor.execute("VACUUM ANALYZE reminders_deliveryattempt")
    connection.close()


def _run(ids: list[int], processes: int, worker) -> dict:
    """Fork ``processes`` workers, each delivering every P-th batch; return the totals."""
    from django.db import connections

    from reminders.worker.hooks import warm_send_path

    # What a worker's main process loads before its pool forks: the children
    # measure reminders, not their first imports.
    warm_send_path()
    connections.close_all()
    size = _batch_size()
    batches = [ids[i : i + size] for i in range(0, len(ids), size)]
    context = multiprocessing.get_context("fork")
    start = context.Barrier(processes + 1)
    results = context.Queue()
    # Daemonic, so a driver stopped before the start (SIGTERM) does not wait for them
    # at exit; the barrier's timeout ends a child whose driver is gone.
    children = [
        context.Process(
            target=_child, args=(worker, batches[index::processes], start, results), daemon=True
        )
        for index in range(processes)
    ]
    for child in children:
        child.start()
    start.wait(START_TIMEOUT)
    began = CLOCK.monotonic()
    reports = [results.get(timeout=900) for _ in children]
    elapsed = max(report["finished"] for report in reports) - began
    for child in children:
        child.join(60)
    sent = sum(report["sent"] for report in reports)
    return {
        "sent": sent,
        "elapsed": elapsed,
        "rate": sent / elapsed,
        "worker_cpu": sum(report["cpu"] for report in reports),
        "backend_cpu": sum(report["backend_cpu"] for report in reports),
        "expected": len(ids),
    }


def _child(worker, batches, start, results) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    before, backend_before = _own_cpu(), _cpu_of(backend)
    start.wait(START_TIMEOUT)
    sent = 0
    for batch in batches:
        sent += worker(batch)
    finished = CLOCK.monotonic()
    results.put(
        {
            "sent": sent,
            "finished": finished,
            "cpu": _own_cpu() - before,
            "backend_cpu": _cpu_of(backend) - backend_before,
        }
    )
    connection.close()


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _cpu_of(pid: int) -> float:
    from bench.harness import cpu_seconds

    return cpu_seconds([pid])


class InstantChannel:
    """A provider in the worker's own process that accepts every envelope at once."""

    name = "instant"
    honours_idempotency_keys = True
    max_concurrency = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        return None

    async def send(self, envelope) -> str:
        return f"instant-{envelope.reminder_id}"


def _instant_factory(name, *, clock):
    return InstantChannel


def _product_worker(batch: list[int]) -> int:
    from reminders.worker import bridge, pipeline

    bridge.channel_factory = _instant_factory  # the only stand-in: the provider
    bridge._channel_values = lambda name: "instant"  # (what the kept session is keyed by)
    counts = pipeline.deliver(batch, channel="http", worker="dblayer")
    return counts.get("sent", 0)


def _baseline_worker(batch: list[int]) -> int:
    from django.db import transaction

    from clock import default_clock
    from reminders.content import reminder_envelope
    from reminders.models import DeliveryAttempt, Reminder

    clock = default_clock()
    sent = 0
    for reminder_id in batch:
        now = clock.now()
        token = uuid.uuid4()
        with transaction.atomic():
            reminder = (
                Reminder.objects.select_for_update(of=("self",))
                .select_related("attendee", "workshop")
                .get(pk=reminder_id)
            )
            if reminder.status != "pending" or reminder.deadline_at <= now:  # from the workshop
                continue
            Reminder.objects.filter(pk=reminder_id).update(
                status="sending",
                claim_token=token,
                lease_expires_at=now + timedelta(minutes=5),
                attempts=reminder.attempts + 1,
                updated_at=now,
            )
        envelope = reminder_envelope(reminder=reminder)
        message_id = f"instant-{envelope.reminder_id}"
        with transaction.atomic():
            Reminder.objects.filter(pk=reminder_id, claim_token=token).update(
                status="sent",
                provider_message_id=message_id,
                sent_at=now,
                claim_token=None,
                lease_expires_at=None,
            )
            DeliveryAttempt.objects.create(
                reminder_id=reminder_id,
                number=reminder.attempts + 1,
                claim_token=token,
                channel="http",
                claimed_at=now,
                lease_expires_at=now,
                finished_at=now,
                outcome="sent",
                provider_calls=1,
                provider_message_id=message_id,
            )
        sent += 1
    return sent


def _report(rows) -> int:
    print()
    print(
        f"{'processes':>9} | {'product /s':>10} {'worker ms':>9} {'pg ms':>6} | "
        f"{'baseline /s':>11} {'worker ms':>9} {'pg ms':>6} | {'ratio':>6}"
    )
    summary = {}
    ok = True
    for processes, product, baseline in rows:

        def ms(phase: dict, key: str) -> float:
            return 1000 * phase[key] / max(1, phase["sent"])

        ratio = product["rate"] / baseline["rate"]
        print(
            f"{processes:>9} | {product['rate']:>10.0f} {ms(product, 'worker_cpu'):>9.3f} "
            f"{ms(product, 'backend_cpu'):>6.3f} | {baseline['rate']:>11.0f} "
            f"{ms(baseline, 'worker_cpu'):>9.3f} {ms(baseline, 'backend_cpu'):>6.3f} | "
            f"{ratio:>5.1f}x"
        )
        for phase in (product, baseline):
            if phase["sent"] != phase["expected"]:
                print(f"  WARNING: {phase['sent']} of {phase['expected']} sent")
                ok = False
        summary[f"processes_{processes}"] = {
            "rate": round(product["rate"]),
            "worker_ms": round(ms(product, "worker_cpu"), 3),
            "pg_ms": round(ms(product, "backend_cpu"), 3),
            "baseline_rate": round(baseline["rate"]),
            "baseline_worker_ms": round(ms(baseline, "worker_cpu"), 3),
            "ratio": round(ratio, 1),
        }
    best = max(summary.values(), key=lambda row: row["rate"])["rate"]
    met = best >= TARGET_RATE
    print(
        f"best: {best}/s (target >= {TARGET_RATE}/s): {'ok' if met else 'MISSED'}; bounded by "
        "the CPU of the workers and of PostgreSQL on this machine's cores"
    )
    print(json.dumps({"dblayer": summary, "targets_met": met and ok}))
    summary["best_rate"] = best
    summary["batch_size"] = _batch_size()
    return (0 if ok else 1), summary


if __name__ == "__main__":
    run_program(main)
