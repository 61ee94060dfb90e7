"""End-to-end benchmark: beat and two workers deliver due reminders over HTTP (not a test).

    .venv/bin/python -m bench.e2e                                  # 10,000 reminders
    .venv/bin/python -m bench.e2e --reminders 2000 --baseline-count 300   # quick

Everything runs on loopback, on servers of its own (bench.harness): a
PostgreSQL cluster with ``pg_stat_statements``, a redis-server, and the
loopback HTTP sink as a process, answering after ``--delay`` (100 ms) and
enforcing ``--rate`` (200) requests per second itself (429 beyond it).

1. Product: ``--reminders`` enrollments in workshops starting within the
   next hours; one ``celery -A config beat`` and two ``celery -A config
   worker`` (prefork, ``--pool-size`` processes each) with
   ``REMINDERS_CHANNEL=http`` and ``REMINDERS_RATE_LIMIT`` = the sink's
   limit. Timed from the first scan (the earliest ``Reminder.created_at``:
   the plan runs at the start of the scan) to the last accepted request at
   the sink.
2. Baseline, same run, same sink, same workers' shape: the first
   ``--baseline-count`` of the same reminders, one Celery task each
   (bench.e2e_baseline: blocking ``httpx.Client``, Celery's per-task
   ``rate_limit`` at rate / 2 per worker), published before its two
   workers start. Its rate is the steady rate the sink saw.

Counted for each, honestly and the same way:

- database statements: ``pg_stat_statements`` (``track=top``) calls in the
  benchmark database by the role the workers and beat use, reset before
  each phase (the driver polls as another role, so it is not counted): the
  statements the processes send, with and without transaction control
  (BEGIN/COMMIT/SAVEPOINT...), and apart from them the foreign-key checks
  PostgreSQL runs itself at COMMIT (Django's foreign keys are deferred, so
  they show as top-level statements; no client round trip); the table must
  not have evicted entries (``pg_stat_statements_info.dealloc`` = 0);
  ``xact_commit`` of ``pg_stat_database`` as a cross-check (the whole
  database, the driver's polling included);
- broker messages: Redis ``LPUSH`` calls (``INFO commandstats``, reset
  before each phase): one per task message published, scans included; the
  rate limiter's own Redis round trips (``EVALSHA``) are shown apart;
- memory: every 0.5 s, RSS and PSS summed over each worker's process tree
  (main process and pool children); the peak of the RSS sum is the figure
  held against the target (it counts pages shared between the prefork
  processes once per process, so it overstates; PSS does not).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import httpx

from bench.harness import (
    CLOCK,
    MemorySampler,
    PrivatePostgres,
    PrivateRedis,
    Proc,
    SinkProcess,
    base_env,
    celery_beat,
    celery_worker,
    cpu_seconds,
    family,
    make_workdir,
    manage,
    postmaster_pid,
    run_program,
    save_results,
    saveable,
    wait_until,
)
from loopback.windows import max_in_window

SECRET = "e2e-secret-0a1b2c3d4e5f6a7b8c9d0e1f2a"
DATABASE = "bench_e2e"
OBSERVER = "observer"
TARGET_FRACTION = 0.95
TARGET_CPU_MS = 1.5  # worker CPU per reminder (issue 14)
TARGET_PSS_MB = 150.0  # one worker's tree: the parent and its prefork children
TX_CONTROL = r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|SET |SHOW )"
# The referential-integrity checks PostgreSQL runs itself for Django's deferred
# foreign keys, at COMMIT (so pg_stat_statements sees them as top-level).
FK_CHECK = r"FOR KEY SHARE OF x$"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.e2e",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--channel", choices=["http", "smtp"], default="http")
    parser.add_argument("--reminders", type=int, default=10_000)
    parser.add_argument("--baseline-count", type=int, default=1_500)
    parser.add_argument(
        "--rate",
        type=int,
        default=200,
        help="provider limit, requests/s; 0: no limit anywhere (the unthrottled run)",
    )
    parser.add_argument("--delay", type=float, default=0.1, help="provider answer time (s)")
    parser.add_argument("--pool-size", type=int, default=2, help="prefork processes per worker")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="REMINDERS_CONCURRENCY (default: product's)"
    )
    parser.add_argument("--per-workshop", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument(
        "--smtp-connections", type=int, default=8, help="REMINDERS_SMTP_CONNECTIONS (smtp only)"
    )
    parser.add_argument(
        "--events-cost",
        action="store_true",
        help="run the product a second time with REMINDERS_TASK_EVENTS=0 and compare the CPU",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--save",
        action="store_true",
        help="write the figures, stamped with the commit and date, to "
        "bench/results/e2e-CHANNEL-COMMIT.json (refused from a changed tree)",
    )
    args = parser.parse_args(argv)
    started = saveable(results_name(args)) if args.save else None

    workdir = make_workdir("e2e-")
    logs = workdir / "logs"
    postgres = PrivatePostgres(workdir / "pg", durable=True, stat_statements=True)
    redis = PrivateRedis(workdir / "redis")
    sink = None
    try:
        postgres.init()
        postgres.start()
        redis.start()
        postgres.execute(f"CREATE DATABASE {DATABASE}")
        postgres.execute(f"CREATE ROLE {OBSERVER} LOGIN SUPERUSER")
        postgres.execute("CREATE EXTENSION pg_stat_statements", database=DATABASE)
        env = base_env(
            DATABASE_URL=postgres.url(DATABASE),
            CELERY_BROKER_URL=redis.url(0),
            REMINDERS_VAR_DIR=str(workdir / "var"),
            REMINDERS_CHANNEL=args.channel,
            REMINDERS_RATE_LIMIT=str(args.rate),
            REMINDERS_SCAN_INTERVAL="5",
            BENCH_BASELINE_RATE=f"{args.rate / 2:g}/s" if args.rate else "",
        )
        if args.channel == "http":
            limit = ["--rate-limit", str(args.rate)] if args.rate else []
            sink = SinkProcess(
                "http", logs, "--secret", SECRET, "--delay", str(args.delay), *limit
            )  # fmt: skip
            env.update(REMINDERS_HTTP_URL=f"{sink.address}/reminders", REMINDERS_HTTP_SECRET=SECRET)
        else:
            # The SMTP sink answers each DATA after --delay; it enforces no rate, so only
            # the product's limiter keeps the rate (its busiest second is still counted).
            sink = SinkProcess("smtp", logs)
            sink.control(data_delay=args.delay)
            host, port = sink.address.rsplit(":", 1)
            env.update(
                EMAIL_HOST=host,
                EMAIL_PORT=port,
                REMINDERS_SMTP_CONNECTIONS=str(args.smtp_connections),
            )
        if args.concurrency:
            env["REMINDERS_CONCURRENCY"] = str(args.concurrency)
        manage(env, "migrate", "--verbosity", "0")
        os.environ.update(env)
        os.environ["LOG_LEVEL"] = "WARNING"
        import django

        django.setup()
        seed(args)
        observer = Observer(postgres, redis)
        enforced = (
            "enforced by the sink (429 beyond)"
            if args.channel == "http"
            else f"kept by the product's limiter, {args.smtp_connections} SMTP connections"
        )
        print(
            f"end-to-end on loopback: {args.reminders} due reminders, {args.channel} sink "
            f"answering after {args.delay * 1000:.0f} ms, {args.rate}/s {enforced}, "
            f"2 workers x {args.pool_size} prefork processes, {os.cpu_count()} CPUs",
            flush=True,
        )
        product = run_product(args, env, logs, sink, observer)
        quiet = loud = None
        if args.events_cost:
            # The same reminders twice more, from pending: without task events, then
            # with them. A run on reset rows costs the workers more than the first
            # run whatever the setting (checked with events on in both), so the two
            # compared are both runs on reset rows.
            reset_reminders(observer, sink)
            quiet = run_product(args, {**env, "REMINDERS_TASK_EVENTS": "0"}, logs, sink, observer)
            quiet["name"] = "events off"
            reset_reminders(observer, sink)
            loud = run_product(args, {**env, "REMINDERS_TASK_EVENTS": "1"}, logs, sink, observer)
            loud["name"] = "events on"
        baseline = run_baseline(args, env, logs, sink, observer)
    finally:
        if sink is not None:
            sink.close()
        redis.close()
        postgres.close()
    ok = report(args, product, baseline)
    if quiet is not None:
        report_events(loud, quiet)
    if args.save:
        print(f"saved to {save(args, started, product, baseline, quiet, loud)}")
    if args.keep:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if args.check and not ok else 0


def reset_reminders(observer, sink: SinkProcess) -> None:
    """Bring every reminder back to ``pending`` with no attempts, as if just planned."""
    observer.conn.execute("TRUNCATE reminders_deliveryattempt")
    observer.conn.execute(
        "UPDATE reminders_reminder SET status = 'pending', claim_token = NULL, "
        "lease_expires_at = NULL, attempts = 0, sent_at = NULL, provider_message_id = '', "
        "status_reason = '', last_error = '', next_attempt_at = NULL, queued_until = NULL, "
        "created_at = now()"
    )
    observer.conn.execute("VACUUM ANALYZE reminders_reminder")
    # The broker and the limiter's keys: nothing is in flight between the runs.
    observer.redis.flushall()
    if sink.kind == "http":
        httpx.post(f"{sink.address}/_reset", timeout=10).raise_for_status()


def report_events(loud: dict, quiet: dict) -> None:
    """Print what Celery's task events cost the workers: the two runs on reset rows compared."""
    on, off = (1000 * p["cpu"].used["workers"] / max(1, p["sent"]) for p in (loud, quiet))
    print(
        f"task events: worker CPU per reminder {on:.2f} ms with them, {off:.2f} ms without "
        f"({on - off:+.2f} ms, {on / off:.3f}x); sent {loud['sent']} and {quiet['sent']}"
    )
    for phase in (loud, quiet):
        cpu = phase["cpu"]
        parts = ", ".join(f"{name} {used:.1f}" for name, used in cpu.used.items())
        window = phase["window"]
        print(
            f"  {phase['name']}: {phase['elapsed']:.1f} s, busiest second {window['busiest']}, "
            f"{window['status_429']} 429s, limiter round trips "
            f"{phase['counters']['evalsha'] / max(1, phase['sent']):.3f} per reminder; "
            f"CPU seconds over {cpu.elapsed:.1f} s: {parts}"
        )


def seed(args) -> None:
    from django.db import connection

    from workshops.models import Attendee, Enrollment, Workshop

    rng = random.Random(6)
    zones = ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney", "UTC"]
    count = math.ceil(args.reminders / args.per_workshop)
    now = CLOCK.now()
    workshops = Workshop.objects.bulk_create(
        Workshop(
            title=f"E2E workshop {i}",
            starts_at=now + timedelta(hours=2) + i * timedelta(hours=18) / count,
            ends_at=now + timedelta(hours=4) + i * timedelta(hours=18) / count,
            timezone=zones[i % len(zones)],
        )
        for i in range(count)
    )
    people = Attendee.objects.bulk_create(
        Attendee(name=f"Person {i}", email=f"person{i}@example.com")
        for i in range(max(2 * args.per_workshop, args.reminders // 5))
    )
    left = args.reminders
    enrollments = []
    for workshop in workshops:
        take = min(args.per_workshop, left)
        enrollments += [Enrollment(attendee=p, workshop=workshop) for p in rng.sample(people, take)]
        left -= take
    Enrollment.objects.bulk_create(enrollments, batch_size=2000)
    connection.close()


class Observer:
    """Read the counters of PostgreSQL and Redis as a role the product never uses."""

    def __init__(self, postgres: PrivatePostgres, redis: PrivateRedis) -> None:
        import psycopg

        self.postgres = postgres
        self.conn = psycopg.connect(
            f"postgres://{OBSERVER}@127.0.0.1:{postgres.port}/{DATABASE}", autocommit=True
        )
        self.redis = redis.client()
        self.redis_pid = redis.process.pid

    def scalar(self, sql: str, params=None):
        return self.conn.execute(sql, params).fetchone()[0]

    def reset(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")
        self.redis.config_resetstat()
        self.commits_before = self.commits()

    def commits(self) -> int:
        return self.scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DATABASE,)
        )

    def read(self) -> dict:
        where = (
            "dbid = (SELECT oid FROM pg_database WHERE datname = %s) "
            "AND userid = (SELECT oid FROM pg_roles WHERE rolname = 'postgres')"
        )

        def calls(condition: str = "", *params) -> int:
            sql = (
                f"SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE {where} {condition}"
            )
            return int(self.scalar(sql, (DATABASE, *params)))

        stats = self.redis.info("commandstats")
        top = self.conn.execute(
            f"SELECT calls, regexp_replace(left(query, 90), '\\s+', ' ', 'g') "
            f"FROM pg_stat_statements WHERE {where} AND query !~ %s ORDER BY calls DESC LIMIT 6",
            (DATABASE, FK_CHECK),
        ).fetchall()
        return {
            "top": top,
            "statements": calls("AND query !~ %s", FK_CHECK),
            "statements_no_tx": calls("AND query !~ %s AND query !~* %s", FK_CHECK, TX_CONTROL),
            "fk_checks": calls("AND query ~ %s", FK_CHECK),
            "dealloc": int(self.scalar("SELECT dealloc FROM pg_stat_statements_info")),
            "commits": self.commits() - self.commits_before,
            "lpush": int(stats.get("cmdstat_lpush", {}).get("calls", 0)),
            "evalsha": int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
            + int(stats.get("cmdstat_eval", {}).get("calls", 0)),
            "redis_commands": sum(int(v.get("calls", 0)) for v in stats.values()),
        }

    def sent(self) -> int:
        return self.scalar("SELECT count(*) FROM reminders_reminder WHERE status = 'sent'")

    def open_count(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM reminders_reminder "
            "WHERE status IN ('pending', 'queued', 'sending')"
        )


def sink_window(sink: SinkProcess, since: int) -> dict:
    """Summarise the sink's log from line ``since`` on: accepted, 429s, busiest second."""
    records = sink.records()[since:]
    if sink.kind == "smtp":  # the SMTP sink logs accepted messages only
        ids = Counter(r["message_id"] for r in records)
        accepted = [r["arrived_at"] for r in records]
        status_429, duplicates = 0, sum(n - 1 for n in ids.values())
    else:
        accepted = [r["arrived_at"] for r in records if r["status"] == 200 and not r["duplicate"]]
        status_429 = sum(1 for r in records if r["status"] == 429)
        duplicates = sum(1 for r in records if r["duplicate"])
    return {
        "requests": len(records),
        "accepted": len(accepted),
        "status_429": status_429,
        "duplicates": duplicates,
        "busiest": max_in_window([r["arrived_at"] for r in records]),
        "busiest_accepted": max_in_window(accepted),
        "first": min(accepted) if accepted else None,
        "last": max(accepted) if accepted else None,
    }


class CpuMeter:
    """CPU seconds used by each part of the system between ``start`` and ``stop``."""

    def __init__(self, parts: dict) -> None:
        self.parts = parts  # name -> callable returning the pids to count
        self.used: dict[str, float] = {}
        self.elapsed = 0.0

    def _read(self) -> dict[str, float]:
        return {name: cpu_seconds(pids()) for name, pids in self.parts.items()}

    def start(self) -> None:
        self.began_at = CLOCK.monotonic()
        self.before = self._read()

    def stop(self) -> None:
        self.elapsed = CLOCK.monotonic() - self.began_at
        after = self._read()
        self.used = {name: after[name] - self.before.get(name, 0.0) for name in after}


def cpu_parts(workers: list[Proc], sink: SinkProcess, observer, beat: Proc | None = None) -> dict:
    """Name the processes whose CPU time is counted (with the children they reaped)."""
    parts = {
        "workers": lambda: [pid for proc in workers for pid in proc.group_pids()],
        "beat": beat.group_pids if beat is not None else list,
        "sink": lambda: [sink.process.pid],
        "postgres": lambda: family(postmaster_pid(observer.postgres)),
        "redis": lambda: [observer.redis_pid],
        "driver": lambda: [os.getpid()],
    }
    return parts


def run_product(args, env, logs, sink: SinkProcess, observer: Observer) -> dict:
    since = len(sink.records())
    workers = [celery_worker(env, f"worker{i}", logs, concurrency=args.pool_size) for i in (1, 2)]
    sampler = MemorySampler({proc.name: proc for proc in workers}).start()
    beat = None
    try:
        for proc in workers:
            proc.wait_for(" ready.", timeout=120)
        sampler.sample()
        idle = {name: replace(peak) for name, peak in sampler.peaks.items()}
        # Counted from here: the workers are up and idle; the first scan follows beat's start.
        observer.reset()
        beat = celery_beat(env, "beat", logs)
        cpu = CpuMeter(cpu_parts(workers, sink, observer, beat))
        cpu.start()
        beat.wait_for("beat: Starting", timeout=120)
        wait_until(
            lambda: observer.open_count() == 0 and observer.sent() > 0,
            timeout=args.timeout,
            what=f"{args.reminders} reminders to be sent",
            interval=1,
        )
        CLOCK.sleep_blocking(1)
        cpu.stop()
        counters = observer.read()
        first_scan = observer.scalar("SELECT min(created_at) FROM reminders_reminder")
        statuses = dict(
            observer.conn.execute(
                "SELECT status, count(*) FROM reminders_reminder GROUP BY status"
            ).fetchall()
        )
    finally:
        peaks = sampler.stop()
        stop_all([proc for proc in (beat, *workers) if proc is not None])
    window = sink_window(sink, since)
    offset = CLOCK.now().timestamp() - CLOCK.monotonic()
    elapsed = window["last"] + offset - first_scan.timestamp()
    return {
        "name": "product",
        "sent": statuses.get("sent", 0),
        "statuses": statuses,
        "elapsed": elapsed,
        "rate": statuses.get("sent", 0) / elapsed,
        "steady": (window["accepted"] - 1) / (window["last"] - window["first"]),
        "window": window,
        "counters": counters,
        "peaks": peaks,
        "idle": idle,
        "cpu": cpu,
        "workers": workers,
    }


def run_baseline(args, env, logs, sink: SinkProcess, observer: Observer) -> dict:
    from config.celery import app

    if sink.kind == "http":
        httpx.post(f"{sink.address}/_reset", timeout=10).raise_for_status()
    since = len(sink.records())
    ids = [
        row[0]
        for row in observer.conn.execute(
            "SELECT r.id FROM reminders_reminder r JOIN workshops_workshop w "
            "ON w.id = r.workshop_id ORDER BY w.starts_at, r.id LIMIT %s",
            (args.baseline_count,),
        ).fetchall()
    ]
    observer.reset()
    with app.producer_or_acquire() as producer:
        for reminder_id in ids:
            app.send_task(
                f"bench.baseline_send_{args.channel}",
                args=[reminder_id],
                queue="baseline",
                producer=producer,
            )
    extra = ("-I", "bench.e2e_baseline", "-Q", "baseline")
    workers = [
        celery_worker(env, f"baseline{i}", logs, concurrency=args.pool_size, extra=extra)
        for i in (1, 2)
    ]
    sampler = MemorySampler({proc.name: proc for proc in workers}).start()
    cpu = CpuMeter(cpu_parts(workers, sink, observer))
    cpu.start()
    try:
        wait_until(
            lambda: (
                sink_window(sink, since)["accepted"] >= len(ids)
                or all(
                    proc.count("succeeded") + proc.count("raised") >= len(ids) for proc in workers
                )
            ),
            timeout=args.timeout,
            what=f"the baseline's {len(ids)} sends",
            interval=1,
        )
        CLOCK.sleep_blocking(1)
        cpu.stop()
        counters = observer.read()
    finally:
        peaks = sampler.stop()
        stop_all(workers)
    window = sink_window(sink, since)
    steady = (window["accepted"] - 1) / (window["last"] - window["first"])
    return {
        "name": "baseline",
        "sent": window["accepted"],
        "elapsed": window["last"] - window["first"],
        "rate": steady,
        "steady": steady,
        "window": window,
        "counters": counters,
        "peaks": peaks,
        "idle": {},
        "cpu": cpu,
        "workers": workers,
    }


def stop_all(procs: list[Proc]) -> None:
    """Warm-stop every process at once, then wait for each."""
    for proc in procs:
        proc.signal_main(signal.SIGTERM)
    for proc in procs:
        proc.stop(timeout=60)


def report(args, product: dict, baseline: dict) -> bool:
    def per(phase: dict, key: str) -> str:
        return f"{phase['counters'][key] / max(1, phase['sent']):.3f}"

    def memory(phase: dict) -> str:
        worst = max(phase["peaks"].values(), key=lambda p: p.rss_sum_kb)
        return f"{worst.rss_sum_kb / 1024:.0f} MB ({worst.processes} proc)"

    def pss(phase: dict) -> str:
        worst = max(phase["peaks"].values(), key=lambda p: p.pss_sum_kb)
        return f"{worst.pss_sum_kb / 1024:.0f} MB"

    rows = [
        ("reminders delivered", lambda p: f"{p['sent']}"),
        ("time, first scan -> last send", lambda p: f"{p['elapsed']:.1f} s"),
        ("achieved rate", lambda p: f"{p['rate']:.1f}/s"),
        ("  / rate limit", lambda p: f"{p['rate'] / args.rate:.3f}" if args.rate else "-"),
        ("steady rate seen by the sink", lambda p: f"{p['steady']:.1f}/s"),
        ("sink: busiest 1 s window", lambda p: f"{p['window']['busiest']}"),
        ("sink: 429 answers", lambda p: f"{p['window']['status_429']}"),
        ("sink: duplicate keys", lambda p: f"{p['window']['duplicates']}"),
        ("SQL statements sent / reminder", lambda p: per(p, "statements")),
        ("  without BEGIN/COMMIT/SAVEPOINT", lambda p: per(p, "statements_no_tx")),
        ("  transactions / reminder", lambda p: per(p, "commits")),
        ("  FK checks run by PostgreSQL", lambda p: per(p, "fk_checks")),
        ("broker messages (LPUSH) / reminder", lambda p: per(p, "lpush")),
        ("limiter round trips / reminder", lambda p: per(p, "evalsha")),
        ("worker peak RSS, tree sum (max)", memory),
        ("worker peak PSS, tree sum (max)", pss),
    ]
    print()
    print(f"{'':<38}{'product':>18}{'baseline':>18}")
    for label, cell in rows:
        print(f"{label:<38}{cell(product):>18}{cell(baseline):>18}")
    for phase in (product, baseline):
        for name, peak in sorted(phase["peaks"].items()):
            idle = phase["idle"].get(name)
            print(
                f"  {name:<10} peak RSS sum {peak.rss_sum_kb / 1024:6.1f} MB, PSS sum "
                f"{peak.pss_sum_kb / 1024:6.1f} MB, largest process {peak.rss_max_kb / 1024:5.1f}"
                f" MB, {peak.processes} processes"
                + (f" (idle after start: RSS sum {idle.rss_sum_kb / 1024:.1f} MB)" if idle else "")
            )
        cpu = phase["cpu"]
        parts = ", ".join(f"{name} {used:.1f}" for name, used in cpu.used.items())
        total = sum(cpu.used.values())
        capacity = cpu.elapsed * (os.cpu_count() or 1)
        print(
            f"  {phase['name']}: CPU seconds over {cpu.elapsed:.1f} s: {parts}; "
            f"{total:.1f} of {capacity:.0f} available ({total / capacity:.0%}); "
            f"{1000 * cpu.used['workers'] / max(1, phase['sent']):.2f} ms of worker CPU per reminder"
        )
        print(f"  {phase['name']}: most frequent statements (calls)")
        for calls, query in phase["counters"]["top"]:
            print(f"    {calls:>7}  {query}")
        if phase["counters"]["dealloc"]:
            print(f"  WARNING: pg_stat_statements evicted entries during the {phase['name']}")
    if product["statuses"].get("sent") != args.reminders:
        print(f"  product statuses: {product['statuses']}")
    fraction = product["rate"] / args.rate if args.rate else None
    speedup = product["rate"] / baseline["rate"]
    rss = max(p.rss_sum_kb for p in product["peaks"].values()) / 1024
    pss = max(p.pss_sum_kb for p in product["peaks"].values()) / 1024
    cpu_ms = {
        phase["name"]: 1000 * phase["cpu"].used["workers"] / max(1, phase["sent"])
        for phase in (product, baseline)
    }
    checks = {}
    if args.rate:
        checks[f"rate >= {TARGET_FRACTION} of the limit"] = fraction >= TARGET_FRACTION
        checks["busiest window <= the limit"] = product["window"]["busiest"] <= args.rate
    checks |= {
        "no 429": product["window"]["status_429"] == 0,
        f"worker CPU <= {TARGET_CPU_MS:g} ms per reminder": cpu_ms["product"] <= TARGET_CPU_MS,
        f"worker tree PSS <= {TARGET_PSS_MB:g} MB": pss <= TARGET_PSS_MB,
        "every reminder sent": product["statuses"].get("sent") == args.reminders,
    }
    print(
        f"speed-up over the baseline: {speedup:.1f}x; worker CPU per reminder "
        f"{cpu_ms['product']:.2f} ms against {cpu_ms['baseline']:.2f} ms "
        f"({cpu_ms['baseline'] / cpu_ms['product']:.2f}x less)"
    )
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    print(
        json.dumps(
            {
                "e2e": {
                    "rate": round(product["rate"], 1),
                    "fraction": round(fraction, 3) if fraction is not None else None,
                    "speedup": round(speedup, 1),
                    "busiest": product["window"]["busiest"],
                    "cpu_ms": round(cpu_ms["product"], 2),
                    "rss_mb": round(rss, 1),
                    "pss_mb": round(pss, 1),
                },
                "targets_met": all(checks.values()),
            }
        )
    )
    return all(checks.values())


def phase_figures(args, phase: dict) -> dict:
    sent = max(1, phase["sent"])
    counters = phase["counters"]
    cpu = phase["cpu"]
    return {
        "sent": phase["sent"],
        "seconds": round(phase["elapsed"], 1),
        "rate": round(phase["rate"], 1),
        "fraction_of_limit": round(phase["rate"] / args.rate, 3) if args.rate else None,
        "steady_rate": round(phase["steady"], 1),
        "busiest_second": phase["window"]["busiest"],
        "status_429": phase["window"]["status_429"],
        "duplicates": phase["window"]["duplicates"],
        "worker_cpu_ms": round(1000 * cpu.used["workers"] / sent, 2),
        "statements": round(counters["statements"] / sent, 3),
        "limiter_round_trips": round(counters["evalsha"] / sent, 3),
        "rss_mb": round(max(p.rss_sum_kb for p in phase["peaks"].values()) / 1024, 1),
        "pss_mb": round(max(p.pss_sum_kb for p in phase["peaks"].values()) / 1024, 1),
    }


def results_name(args) -> str:
    """Return e2e-CHANNEL (e2e-CHANNEL-unthrottled with --rate 0, -events with --events-cost)."""
    return (
        f"e2e-{args.channel}"
        + ("" if args.rate else "-unthrottled")
        + ("-events" if args.events_cost else "")
    )


def save(args, started: dict, product: dict, baseline: dict, quiet: dict | None = None, loud=None):
    """Write bench/results/NAME-COMMIT.json, NAME from ``results_name``, stamped ``started``."""
    figures = {
        "bench": "e2e",
        "channel": args.channel,
        **started,
        "settings": {
            "reminders": args.reminders,
            "baseline_count": args.baseline_count,
            "rate": args.rate,
            "delay": args.delay,
            "pool_size": args.pool_size,
            "command": f"python -m bench.e2e --channel {args.channel}"
            + ("" if args.rate else " --rate 0")
            + " --save",
        },
        "product": phase_figures(args, product),
        "baseline": phase_figures(args, baseline),
    }
    figures["cpu_ratio"] = round(
        figures["baseline"]["worker_cpu_ms"] / figures["product"]["worker_cpu_ms"], 2
    )
    if quiet is not None:
        figures["events_off"] = phase_figures(args, quiet)
        figures["events_on"] = phase_figures(args, loud)
        figures["events_cpu_ratio"] = round(
            figures["events_on"]["worker_cpu_ms"] / figures["events_off"]["worker_cpu_ms"], 3
        )
        figures["settings"]["command"] = figures["settings"]["command"].replace(
            " --save", " --events-cost --save"
        )
    figures["cpu"] = {name: round(used, 1) for name, used in product["cpu"].used.items()}
    figures["cpu"]["seconds"] = round(product["cpu"].elapsed, 1)
    return save_results(results_name(args), figures)


if __name__ == "__main__":
    run_program(main)
