"""The scan at a million enrollments: statements, time, index use and lock hold (not a test).

    .venv/bin/python -m bench.scan_million                 # 100,000 workshops, 1,000,000 enrollments
    .venv/bin/python -m bench.scan_million --workshops 10000 --save

A private PostgreSQL cluster (bench.harness, default settings) holds
``--workshops`` workshops, ten enrollments each, starting evenly over the next
``--days`` days, so the lead window (REMINDERS_LEAD_MINUTES) holds about
1/days of them. Scans (``reminders.worker.pipeline.scan``) then run back to back
until nothing is left to dispatch: the first plans every reminder in the
window and dispatches up to REMINDERS_DISPATCH_LIMIT, the next ones dispatch
the rest, the last finds nothing to do (the steady state of every later
minute). For each scan it prints the statements sent, their time, and what
each phase did. Then every queued reminder is recorded sent, as its worker
would, and one more scan is timed: the steady state once reminders went out,
where the change notices compare what each attendee was told with their
workshop.

While each scan runs, a probe thread plays a worker: with
``lock_timeout = 100ms`` on its own connection, it claims, again and again,
the first due reminders in deadline order (the rows the scan's dispatch
locks) and a sample of already-queued ones, each claim rolled back. A claim
that waits more than 100 ms for a row lock fails with ``LockNotAvailable``;
the target is none. It also reports the longest claim it saw.

Then the cold scan and the steady scan are replayed once more inside a
transaction that is rolled back, each statement preceded by
``EXPLAIN (ANALYZE, BUFFERS)`` under a savepoint, so the plans are those of
the real state; the indexes each statement used are printed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import threading
import time
from collections import Counter
from datetime import timedelta

from bench.harness import CLOCK, django_on_private_postgres, run_program, save_results, saveable

DATABASE = "bench_scan_million"
LOCK_BUDGET_MS = 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scan_million",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1_000, 100_000],
        help="workshop counts, smallest first; the plans are explained at the largest",
    )
    parser.add_argument("--per-workshop", type=int, default=10)
    parser.add_argument(
        "--days", type=float, default=10.0, help="starts spread over this many days"
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory")
    parser.add_argument(
        "--save",
        action="store_true",
        help="write the figures to bench/results/scan-million-COMMIT.json (from a clean tree)",
    )
    args = parser.parse_args(argv)
    started = saveable("scan-million") if args.save else None

    with django_on_private_postgres("scan-million-", DATABASE, keep=args.keep):
        runs = []
        for size in sorted(args.sizes):
            seeded = _seed(args, size)
            runs.append(_run(seeded, explain=size == max(args.sizes)))
        figures = _summary(runs)
    met = figures["statements_constant"] and figures["lock_waits_over_budget"] == 0
    print(
        f"statements per scan beyond {figures['statements_per_transaction']} per dispatch "
        "transaction, cold "
        f"{figures['cold_fixed_statements']}, steady {figures['steady_fixed_statements']} "
        f"over sizes {sorted(args.sizes)} "
        f"({'constant' if figures['statements_constant'] else 'NOT constant'}); "
        f"claims blocked over {LOCK_BUDGET_MS} ms: {figures['lock_waits_over_budget']} "
        f"of {figures['probe_claims']}; longest claim {figures['longest_claim_ms']} ms; longest "
        f"UPDATE holding locks {figures['longest_locked_update_ms']} ms"
    )
    print(json.dumps({"scan_million": {k: v for k, v in figures.items() if k != "plans"}}))
    if args.save:
        saved = {
            "bench": "scan_million",
            **started,
            "settings": {
                "sizes": sorted(args.sizes),
                "per_workshop": args.per_workshop,
                "days": args.days,
                "command": "python -m bench.scan_million --save",
            },
            "figures": figures,
        }
        print(f"saved to {save_results('scan-million', saved)}")
    return 0 if met else 1


def _seed(args, workshops: int) -> dict:
    """Empty the tables, insert workshops, attendees and enrollments with set-based SQL."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE reminders_deliveryattempt, reminders_reminder, reminders_scanrun, "
            "workshops_enrollment, workshops_attendee, workshops_workshop RESTART IDENTITY CASCADE"
        )
    now = CLOCK.now()
    enrollments = workshops * args.per_workshop
    attendees = max(args.per_workshop, enrollments // 5)
    span = timedelta(days=args.days)
    began = CLOCK.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO workshops_workshop (title, starts_at, ends_at, timezone, status, "
            "created_at, updated_at) "
            "SELECT 'Workshop ' || i, %s + (i * %s / %s), %s + (i * %s / %s) + interval '1 hour', "
            "(ARRAY['Europe/Berlin', 'America/New_York', 'Asia/Tokyo'])[1 + i %% 3], "
            "'scheduled', %s, %s FROM generate_series(0, %s - 1) AS i",
            [now + timedelta(minutes=45), span, workshops]
            + [now + timedelta(minutes=45), span, workshops, now, now, workshops],
        )
        cursor.execute(
            "INSERT INTO workshops_attendee (name, email, timezone, created_at) "
            "SELECT 'Person ' || i, 'person' || i || '@example.com', '', %s "
            "FROM generate_series(0, %s - 1) AS i",
            [now, attendees],
        )
        cursor.execute("SELECT MIN(id) FROM workshops_workshop")
        first_workshop = cursor.fetchone()[0]
        cursor.execute("SELECT MIN(id) FROM workshops_attendee")
        first_attendee = cursor.fetchone()[0]
        # Enrollment k of workshop w goes to attendee (w * per + k) mod A: distinct
        # attendees within a workshop, each attendee in about five workshops.
        cursor.execute(
            "INSERT INTO workshops_enrollment (attendee_id, workshop_id, status, created_at, "
            "updated_at) "
            "SELECT %s + ((w * %s + k) %% %s), %s + w, 'active', %s, %s "
            "FROM generate_series(0, %s - 1) AS w, generate_series(0, %s - 1) AS k",
            [
                first_attendee,
                args.per_workshop,
                attendees,
                first_workshop,
                now,
                now,
                workshops,
                args.per_workshop,
            ],
        )
        for table in ("workshops_workshop", "workshops_attendee", "workshops_enrollment"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    seconds = CLOCK.monotonic() - began
    print(
        f"seeded {workshops} workshops, {attendees} attendees, {enrollments} enrollments "
        f"in {seconds:.1f} s (starts over the next {args.days:g} days)"
    )
    return {"workshops": workshops, "attendees": attendees, "enrollments": enrollments}


class Capture:
    """Record every statement with its kind and wall time (savepoints aside)."""

    def __init__(self, explain: bool = False) -> None:
        self.statements: list[dict] = []
        self.explain = explain

    def __call__(self, execute, sql, params, many, context):
        head = sql.lstrip().upper()
        if head.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            return execute(sql, params, many, context)
        entry = {"kind": _kind(sql)}
        if self.explain:
            entry["indexes"], entry["plan_ms"] = _explain(context["cursor"].cursor, sql, params)
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            entry["ms"] = round(1000 * (time.perf_counter() - started), 1)
            self.statements.append(entry)


def _kind(sql: str) -> str:
    """Return a short name for a statement: its verb and first table."""
    text = " ".join(sql.split())
    verb = text.split(" ", 1)[0].upper()
    match = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', text, re.IGNORECASE)
    table = match.group(1) if match else "?"
    if verb == "SELECT" and " FOR UPDATE" in text.upper():
        verb = "SELECT FOR UPDATE"
    return f"{verb} {table}"


def _explain(cursor, sql: str, params) -> tuple[list[str], float]:
    """EXPLAIN ANALYZE ``sql`` and roll its effects back at once; return its indexes.

    Inside the scan's own transactions under a savepoint, elsewhere in a
    transaction of its own, so the scan then runs as it does in production.
    ``cursor`` is the driver's own, under Django's wrappers, so this is not captured.
    """
    import psycopg

    idle = cursor.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    cursor.execute("BEGIN" if idle else "SAVEPOINT bench_explain")
    try:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    finally:
        cursor.execute("ROLLBACK" if idle else "ROLLBACK TO SAVEPOINT bench_explain")
    found: list[str] = []

    def walk(node: dict) -> None:
        if "Index Name" in node:
            name = f"{node['Node Type']} {node['Index Name']}"
            if name not in found:
                found.append(name)
        elif node.get("Node Type") == "Seq Scan":
            name = f"Seq Scan {node.get('Relation Name')}"
            if name not in found:
                found.append(name)
        for child in node.get("Plans", []):
            walk(child)

    top = plan[0] if isinstance(plan, list) else plan
    walk(top["Plan"])
    return found, round(top.get("Execution Time", 0.0), 1)


class Probe(threading.Thread):
    """A worker's claims, rolled back, under a 100 ms lock timeout, while a scan runs."""

    def __init__(self) -> None:
        super().__init__(name="bench-probe", daemon=True)
        self.stop = threading.Event()
        self.claims = 0
        self.blocked = 0
        self.longest = 0.0

    def run(self) -> None:
        from django.db import OperationalError, connection, transaction

        from reminders.models import Reminder
        from reminders.policy import ReminderPolicy
        from reminders.services import reminder_claim_batch

        with connection.cursor() as cursor:
            cursor.execute(f"SET lock_timeout = '{LOCK_BUDGET_MS}ms'")
        try:
            while not self.stop.is_set():
                now = CLOCK.now()
                due = list(
                    Reminder.objects.filter(
                        ReminderPolicy.from_settings().open_start_q(now, through="workshop__"),
                        status__in=Reminder.OPEN_STATUSES,
                    )
                    .order_by("workshop__starts_at", "id")
                    .values_list("id", flat=True)[:50]
                )
                queued = list(
                    Reminder.objects.filter(status=Reminder.Status.QUEUED)
                    .order_by("-id")
                    .values_list("id", flat=True)[:50]
                )
                ids = due + queued
                if not ids:
                    self.stop.wait(0.01)
                    continue
                started = time.perf_counter()
                try:
                    with transaction.atomic():
                        reminder_claim_batch(ids=ids, channel="http", worker="probe")
                        transaction.set_rollback(True)
                except OperationalError as exc:
                    if "lock timeout" not in str(exc):
                        raise
                    self.blocked += 1
                self.claims += 1
                self.longest = max(self.longest, time.perf_counter() - started)
                self.stop.wait(0.005)  # a worker between chunks; leaves the scan its core
        finally:
            connection.close()


def _run(seeded: dict, *, explain: bool) -> dict:
    from django.db import connection

    from reminders.worker import pipeline

    published: list[int] = []

    def publish(ids):
        published.append(len(ids))

    print(f"\n{seeded['workshops']} workshops, {seeded['enrollments']} enrollments")
    print(
        f"{'scan':>4} | {'stmts':>5} {'seconds':>7} | {'planned':>7} {'dispatched':>10} "
        f"{'msgs':>5} | {'probe claims':>12} {'blocked':>7} {'longest ms':>10} | slowest statements"
    )
    scans = []
    index = 0
    while True:
        index += 1
        capture = Capture()
        probe = Probe()
        probe.start()
        CLOCK.sleep_blocking(0.2)
        published.clear()
        started = time.perf_counter()
        with connection.execute_wrapper(capture):
            counts = pipeline.scan(publish=publish)
        seconds = time.perf_counter() - started
        probe.stop.set()
        probe.join(30)
        slowest = sorted(capture.statements, key=lambda s: -s["ms"])[:3]
        row = {
            "statements": len(capture.statements),
            "seconds": round(seconds, 3),
            "planned": counts["planned"],
            "dispatched": counts["dispatched"],
            "messages": len(published),
            "probe_claims": probe.claims,
            "probe_blocked": probe.blocked,
            "probe_longest_ms": round(1000 * probe.longest, 1),
            # What a claim meeting a locked row waits for, at most: the slowest
            # UPDATE of reminder rows inside a transaction holding its locks.
            "longest_locked_update_ms": max(
                [s["ms"] for s in capture.statements if s["kind"] == "UPDATE reminders_reminder"],
                default=0.0,
            ),
            "slowest": [f"{s['kind']} {s['ms']} ms" for s in slowest],
            "by_kind": dict(Counter(s["kind"] for s in capture.statements)),
        }
        scans.append(row)
        print(
            f"{index:>4} | {row['statements']:>5} {seconds:>7.2f} | {row['planned']:>7} "
            f"{row['dispatched']:>10} {row['messages']:>5} | {probe.claims:>12} "
            f"{probe.blocked:>7} {row['probe_longest_ms']:>10} | {'; '.join(row['slowest'])}"
        )
        if counts["dispatched"] == 0 or index >= 20:
            break
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, COUNT(*) FROM reminders_reminder GROUP BY status")
        by_status = dict(cursor.fetchall())
    print(f"reminders by status after the scans: {by_status}")

    run = {
        **seeded,
        "in_lead_window": scans[0]["planned"],
        "scans": scans,
        "told": _told_scan(pipeline, connection),
    }
    if explain:
        # The plans: the steady scan as it is now (the reminders sent), then the cold
        # scan on emptied reminders (the last step: that scan plans and dispatches for real).
        plans = {"steady": _explained_scan(pipeline, connection)}
        with connection.cursor() as cursor:
            # CASCADE: the notices and providers' reports that reference reminders.
            cursor.execute("TRUNCATE reminders_deliveryattempt, reminders_reminder CASCADE")
            cursor.execute("VACUUM ANALYZE reminders_reminder")
        plans["cold"] = _explained_scan(pipeline, connection)
        for name, statements in plans.items():
            print(f"\n{name} scan, EXPLAIN ANALYZE per statement (slowest of each kind):")
            for statement in statements:
                print(
                    f"  {statement['count']:>3} x {statement['kind']:<40} "
                    f"{statement['plan_ms']:>9.1f} ms  "
                    f"{', '.join(statement['indexes']) or '(no table scan)'}"
                )
        run["plans"] = plans
    return run


def _told_scan(pipeline, connection) -> dict:
    """Record every queued reminder as sent, as its worker would (what the attendee was
    told is the workshop as it is now), then time one scan: the steady state once
    reminders went out, where the change notices compare each told row with its workshop.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE reminders_reminder r SET status = 'sent', sent_at = %s, "
            "(told_starts_at, told_ends_at, told_location, told_join_url, told_cancelled) = "
            "(SELECT starts_at, ends_at, location, join_url, FALSE FROM workshops_workshop w "
            "WHERE w.id = r.workshop_id) WHERE status = 'queued'",
            [CLOCK.now()],
        )
        told = cursor.rowcount
        cursor.execute("VACUUM ANALYZE reminders_reminder")
    capture = Capture()
    started = time.perf_counter()
    with connection.execute_wrapper(capture):
        counts = pipeline.scan(publish=lambda ids: None)
    row = {
        "reminders": told,
        "statements": len(capture.statements),
        "seconds": round(time.perf_counter() - started, 3),
        "revisions": counts.get("revisions", 0),
        "slowest": [
            f"{s['kind']} {s['ms']} ms"
            for s in sorted(capture.statements, key=lambda s: -s["ms"])[:3]
        ],
    }
    print(
        f"told: {told} reminders sent; the next scan sent {row['statements']} statements in "
        f"{row['seconds']:.2f} s, {row['revisions']} revisions; {'; '.join(row['slowest'])}"
    )
    return row


def _summary(runs: list[dict]) -> dict:
    """Compare the runs: what a scan sends beyond its dispatch transactions must not grow.

    Beyond one read of the due ids, the dispatch sends
    ``STATEMENTS_PER_TRANSACTION`` statements (lock, queue, record) per
    transaction of at most ``ROWS_PER_TRANSACTION`` rows, so a scan's
    statements are a fixed part plus that many times ceil(dispatched /
    ROWS_PER_TRANSACTION), at most REMINDERS_DISPATCH_LIMIT rows' worth,
    whatever the number of workshops.
    """
    from django.conf import settings

    from reminders.services.dispatch import ROWS_PER_TRANSACTION, STATEMENTS_PER_TRANSACTION

    batch = settings.REMINDERS_BATCH_SIZE
    per_transaction = max(batch, ROWS_PER_TRANSACTION // batch * batch)  # whole batches

    def fixed(row: dict) -> int:
        return row["statements"] - STATEMENTS_PER_TRANSACTION * math.ceil(
            row["dispatched"] / per_transaction
        )

    cold = [fixed(run["scans"][0]) for run in runs]
    steady = [fixed(run["scans"][-1]) for run in runs]
    largest = runs[-1]
    scans = [row for run in runs for row in run["scans"]]
    return {
        "rows_per_transaction": per_transaction,
        "statements_per_transaction": STATEMENTS_PER_TRANSACTION,
        "cold_fixed_statements": cold,
        "steady_fixed_statements": steady,
        "told_statements": [run["told"]["statements"] for run in runs],
        "statements_constant": len(set(cold)) == 1 and len(set(steady)) == 1,
        "most_statements_per_scan": cold[0]
        + STATEMENTS_PER_TRANSACTION
        * math.ceil(settings.REMINDERS_DISPATCH_LIMIT / per_transaction),
        "workshops": largest["workshops"],
        "enrollments": largest["enrollments"],
        "in_lead_window": largest["in_lead_window"],
        "scans": largest["scans"],
        "cold_scan_seconds": largest["scans"][0]["seconds"],
        "steady_scan_seconds": largest["scans"][-1]["seconds"],
        "told_reminders": largest["told"]["reminders"],
        "told_scan_seconds": largest["told"]["seconds"],
        "probe_claims": sum(row["probe_claims"] for row in scans),
        "lock_waits_over_budget": sum(row["probe_blocked"] for row in scans),
        "longest_claim_ms": max(row["probe_longest_ms"] for row in scans),
        "longest_locked_update_ms": max(row["longest_locked_update_ms"] for row in scans),
        "plans": largest.get("plans", {}),
    }


def _explained_scan(pipeline, connection) -> list[dict]:
    """Run one scan with every statement explained first; group them by kind and plan."""
    capture = Capture(explain=True)
    with connection.execute_wrapper(capture):
        pipeline.scan(publish=lambda ids: None)
    grouped: dict[tuple, dict] = {}
    for s in capture.statements:
        key = (s["kind"], tuple(s["indexes"]))
        entry = grouped.setdefault(
            key, {"kind": s["kind"], "indexes": s["indexes"], "count": 0, "plan_ms": 0.0}
        )
        entry["count"] += 1
        entry["plan_ms"] = max(entry["plan_ms"], s["plan_ms"])
    return list(grouped.values())


if __name__ == "__main__":
    run_program(main)
