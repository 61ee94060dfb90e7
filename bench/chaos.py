"""Prove the promise under faults: real processes, real servers, real kills (not a test).

    .venv/bin/python -m bench.chaos                     # full: ~3,000 due reminders per channel
    .venv/bin/python -m bench.chaos --ci                # short: a few hundred, one of each fault
    .venv/bin/python -m bench.chaos --channel smtp --reminders 1000 --seed 3

The driver starts its own PostgreSQL cluster and redis-server on free
loopback ports (bench.harness), migrates once, and runs one *channel run*
per channel (``smtp``, ``http`` or both, in parallel, each in its own child
process with its own database and Redis database). A channel run starts a
loopback sink as a process (bench.sinks: SMTP, or HTTP deduplicating by
Idempotency-Key), one beat and two workers (``celery -A config worker`` /
``beat``, each in its own process group), seeds workshops in several zones
starting within the next hours (due), inside the cutoff, beyond the lead
(not yet due), cancelled before planning, and cancels a workshop and some
enrollments after their reminders were queued. While delivery runs it:

- SIGKILLs a worker's whole process group (after it holds a claim), and
  starts a new worker; several times at random moments in the full run;
- SIGTERMs a worker's main process mid-batch (warm shutdown) and starts a
  new one;
- runs a second beat for a while;
- makes the provider slow, then fail with 5xx, then with 429 for a period,
  then refuse three messages permanently; at the start of that period it
  enrols attendees in workshops whose deadline falls inside it;
- then the staff-changes phase: five dedicated workshops with the same
  attendees, and while their reminders are being sent (some ``sending``,
  some already sent; the provider slowed a little so calls are in flight)
  it commits, through ``workshops.services``, a workshop cancel, two
  enrollment cancels, a move earlier (still outside the cutoff), a move
  inside the cutoff and a move later, and records when each committed;

and the parent restarts Redis (no persistence: every queue is lost) and
PostgreSQL (``pg_ctl -m fast``: every session is cut) once each, under both
channel runs at once. SMTP has no 429: its outage answers ``451`` (transient
server error) then ``450 4.7.0`` (throttled), and its permanent refusal is
``554``.

Then it waits for every reminder to reach a final status and prints one
table. The run fails (exit 1) when, for any channel: a duplicate email
arrived; a due reminder has no final status, or is ``sent`` but never
arrived (lost); a message arrived after its deadline (late); a message
arrived but its reminder was recorded ``missed`` or ``failed``; a message
arrived for a not-yet-due workshop or one cancelled before planning; or
``unknown`` exceeds what the kills could have interrupted: SIGKILLs x (pool
processes x the channel's chunk, the per-worker in-flight limit); on http
(its provider honours idempotency keys, so a lost call is tried again with
its key) an ``unknown`` must also say why: the provider may hold it and it
could not be tried again (its deadline passed, or the attempt cap).

Every staff change the driver makes (the cancels at seeding and after
queueing, and the staff-changes phase) is judged by *when it committed*,
not by the reminders' final statuses. Its bound is the commit time plus
``reminders.services.watch.REVOCATION_WINDOW`` (1 s) plus ``ARRIVAL_SLACK`` (the
loopback hop from a call's start to the sink's clock), and the run fails
on any call for an affected reminder that reached the sink after that
bound carrying what the change revoked (``late_after_change``: for a
cancel any call, for a move into the cutoff any call, for another move a
call without the new start time); in particular on any message for a
cancelled workshop or enrollment after the bound (``sent_after_cancel``)
and any message carrying a moved workshop's old start time after the bound
(``old_time_after_move``). The sinks stamp arrivals with CLOCK_MONOTONIC,
the one monotonic clock of every process on the host; the driver stamps
each commit with the same clock (and with the wall clock, for the table),
and compares arrivals with deadlines by converting monotonic to wall time
with one offset. Leases come from ``config.timing`` (210 s with the 10 s
budget used here), so every run lasts at least that long after its last
SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from bench.harness import (
    CLOCK,
    PYTHON,
    ROOT,
    PrivatePostgres,
    PrivateRedis,
    Proc,
    SinkProcess,
    base_env,
    celery_beat,
    celery_worker,
    make_workdir,
    manage,
    python_env,
    run_program,
    wait_until,
)
from config.timing import TimeBounds

CHANNELS = ("smtp", "http")
HTTP_SECRET = "chaos-secret-0a1b2c3d4e5f6a7b8c9d0e1f"
CHILD_STOP_SECONDS = 300  # a channel's run stopping its workers and beats, at the end
POOL = 2  # prefork processes per worker (the Celery default on this 2-core machine)
SMTP_CONNECTIONS = 4
CALL_TIMEOUT = 15  # REMINDERS_CALL_TIMEOUT's default: the runs leave it alone
SMTP_5XX = "451 4.3.0 Temporary server error, try again later"
SMTP_429 = "450 4.7.0 Too many messages, slow down"
SMTP_PERMANENT = "554 5.7.1 Message refused by policy"
# Loopback latency and thread hand-over between a call's start (where the
# engine consults its gate) and the sink stamping the arrival: added to
# reminders.services.watch.REVOCATION_WINDOW to bound calls after a staff change.
ARRIVAL_SLACK = 0.25
# The provider's answer delay during the staff-changes phase, so that calls
# are in flight when the changes commit (arrivals are stamped before it).
STAFF_PROVIDER_DELAY = 0.3
# At most this many notes name individual offending reminders, per change or kind.
NOTES_PER_KIND = 10
# Which enrollments the phase cancels first: those whose reminder is in flight.
UNSENT_RANK = {"sending": 0, "queued": 1, "pending": 2}
# The staff-changes phase: one dedicated workshop per change, the same attendees in each.
STAFF_WORKSHOPS = (
    ("cancel", "Asia/Tokyo"),
    ("enrollments", "Europe/Berlin"),
    ("earlier", "America/New_York"),
    ("inside", "Australia/Sydney"),
    ("later", "Asia/Kolkata"),
    # Moved inside the cutoff by a bulk update() (a shell fix: no service, no signal),
    # and by a move that an enrolment races (its transaction commits after the move).
    ("bulk-inside", "Europe/London"),
    ("enrol-race", "America/Sao_Paulo"),
)


@dataclass(frozen=True)
class Setting:
    """One size of the run: how many reminders, how fast, and when each fault lands."""

    name: str
    reminders: int
    per_workshop: int
    rate: int
    concurrency: int
    batch_size: int
    budget: int
    kills: int
    outage: float  # seconds of each provider phase (slow, 5xx, 429)
    settle_timeout: float
    staff_per_workshop: int  # attendees of each dedicated workshop of the staff-changes phase
    staff_wait: float  # how long the phase may wait for its reminders to be in flight

    @property
    def bounds(self) -> TimeBounds:
        # config/settings.py derives them from the budget and the call timeout (15 s default).
        return TimeBounds.derive(budget=self.budget, call_timeout=CALL_TIMEOUT)

    @property
    def lease(self) -> int:
        return math.ceil(self.bounds.lease)


CI = Setting(
    name="ci", reminders=300, per_workshop=25, rate=10, concurrency=5, batch_size=20,
    budget=10, kills=1, outage=6.0, settle_timeout=240.0, staff_per_workshop=10,
    staff_wait=60.0,
)  # fmt: skip
FULL = Setting(
    name="full", reminders=3000, per_workshop=50, rate=25, concurrency=10, batch_size=50,
    budget=10, kills=4, outage=15.0, settle_timeout=600.0, staff_per_workshop=25,
    staff_wait=150.0,
)  # fmt: skip


@dataclass(order=True)
class Event:
    """One fault: what, when (seconds after the first scan), and its size."""

    at: float
    what: str
    arg: float = 0.0


def channel_timeline(setting: Setting, rng: random.Random) -> list[Event]:
    """Return the faults one channel run injects, in seconds after its first scan."""
    if setting.name == "ci":
        events = [Event(3, "sigkill"), Event(5, "beat2_start"), Event(25, "beat2_stop")]
        events.append(Event(8, "sigterm"))
        outage_at = 22.0
    else:
        expected = setting.reminders / setting.rate
        kill_until = 0.55 * expected
        events = [Event(rng.uniform(5, kill_until), "sigkill") for _ in range(setting.kills)]
        events.append(Event(rng.uniform(10, kill_until), "sigterm"))
        beat2 = rng.uniform(5, 30)
        events += [Event(beat2, "beat2_start"), Event(beat2 + 40, "beat2_stop")]
        outage_at = 0.7 * expected
    o = setting.outage
    events += [
        Event(outage_at, "tight", o),
        Event(outage_at, "slow"),
        Event(outage_at + o, "fail_5xx"),
        Event(outage_at + 2 * o, "fail_429"),
        Event(outage_at + 3 * o, "healthy"),
        Event(outage_at + 3 * o + 1, "permanent"),
        # After the outage, while the leases of the killed workers' claims run
        # out anyway: the phase does not lengthen the run.
        Event(outage_at + 3 * o + 3, "staff"),
    ]
    return sorted(events)


def shared_timeline(setting: Setting, rng: random.Random) -> list[Event]:
    """Return the faults under every channel run: Redis and PostgreSQL restarts."""
    if setting.name == "ci":
        return [Event(11, "restart_redis", 3), Event(17, "restart_postgres", 3)]
    expected = setting.reminders / setting.rate
    redis_at = rng.uniform(15, 0.35 * expected)
    postgres_at = rng.uniform(0.4 * expected, 0.6 * expected)
    return [Event(redis_at, "restart_redis", 3), Event(postgres_at, "restart_postgres", 3)]


def per_worker_in_flight(channel: str, setting: Setting) -> int:
    """Return how many provider calls one worker (all its pool processes) may have in flight."""
    chunk = min(setting.concurrency, SMTP_CONNECTIONS) if channel == "smtp" else setting.concurrency
    return POOL * chunk


def worker_env(
    channel: str,
    setting: Setting,
    *,
    database_url: str,
    broker_url: str,
    sink_address: str,
    var_dir: Path,
    seed: int,
) -> dict[str, str]:
    """Return the environment of this run's beat and workers (and of its driver)."""
    env = base_env(
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=broker_url,
        REMINDERS_VAR_DIR=str(var_dir),
        REMINDERS_CHANNEL=channel,
        REMINDERS_SCAN_INTERVAL="5",
        REMINDERS_BATCH_BUDGET=str(setting.budget),
        REMINDERS_BATCH_SIZE=str(setting.batch_size),
        REMINDERS_CONCURRENCY=str(setting.concurrency),
        REMINDERS_RATE_LIMIT=str(setting.rate),
        REMINDERS_REQUEUE_AFTER="30",
        # Change notices of the staff phase settle within the run.
        REMINDERS_NOTICE_SETTLE="5",
        REMINDERS_SMTP_CONNECTIONS=str(SMTP_CONNECTIONS),
        REMINDERS_KEY_PREFIX=f"chaos{seed}",
        LOG_LEVEL="INFO",
    )
    if channel == "smtp":
        host, port = sink_address.rsplit(":", 1)
        env.update(EMAIL_HOST=host, EMAIL_PORT=port)
    else:
        env.update(
            REMINDERS_HTTP_URL=f"{sink_address}/reminders", REMINDERS_HTTP_SECRET=HTTP_SECRET
        )
    return env


# =============================================================================
# The parent: private servers, shared faults, the table.
# =============================================================================


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--channel", choices=["smtp", "http", "both"], default="both")
    parser.add_argument("--reminders", type=int, default=None, help="due reminders per channel")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ci", action="store_true", help="short setting: one of each fault")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the work directory")
    parser.add_argument("--child", choices=CHANNELS, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--broker-url", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    setting = CI if args.ci else FULL
    if args.reminders:
        setting = Setting(**{**asdict(setting), "reminders": args.reminders})
    if args.child:
        return ChannelRun(args.child, setting, args).run()
    return run_parent(args, setting)


def lock_report(log: Path) -> dict:
    """What PostgreSQL logged about locks: deadlocks, and waits over 1 s, with the first lines.

    The cluster runs with ``log_lock_waits`` (bench.harness), so a staff
    change or a worker that waited long on a lock leaves the holder's pid
    and the statement in the log. A deadlock means two writers took locks in
    different orders: docs/runtime_packet.md names the one order they share.
    """
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    deadlocks = [line for line in lines if "deadlock detected" in line]
    waits = [line for line in lines if "still waiting for" in line]
    return {
        "deadlocks": len(deadlocks),
        "waits_over_1s": len(waits),
        "first": [line.strip()[:300] for line in (deadlocks + waits)[:5]],
    }


def run_parent(args, setting: Setting) -> int:
    channels = CHANNELS if args.channel == "both" else (args.channel,)
    rng = random.Random(args.seed)
    began = CLOCK.monotonic()
    workdir = make_workdir("chaos-", args.workdir)
    say(f"work directory {workdir}")
    postgres = PrivatePostgres(workdir / "pg", durable=False)
    redis = PrivateRedis(workdir / "redis")
    children: dict[str, subprocess.Popen] = {}
    shared_done: list[dict] = []
    try:
        postgres.init()
        postgres.start()
        redis.start()
        postgres.execute("CREATE DATABASE chaos_template")
        manage(
            base_env(DATABASE_URL=postgres.url("chaos_template"), CELERY_BROKER_URL=redis.url(0)),
            "migrate",
            "--verbosity",
            "0",
        )
        say(f"private PostgreSQL on :{postgres.port}, redis-server on :{redis.port}, migrated")
        started: dict[str, threading.Event] = {}
        for number, channel in enumerate(channels, start=1):
            postgres.execute(f"CREATE DATABASE chaos_{channel} TEMPLATE chaos_template")
            run_dir = workdir / channel
            run_dir.mkdir()
            children[channel] = subprocess.Popen(
                [
                    PYTHON, "-m", "bench.chaos", "--child", channel, "--seed", str(args.seed),
                    "--reminders", str(setting.reminders), *(["--ci"] if args.ci else []),
                    "--database-url", postgres.url(f"chaos_{channel}"),
                    "--broker-url", redis.url(number), "--run-dir", str(run_dir),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=python_env(),
            )  # fmt: skip
            started[channel] = threading.Event()
            threading.Thread(
                target=_echo, args=(channel, children[channel], started[channel]), daemon=True
            ).start()
        for channel, event in started.items():
            if not event.wait(180):
                raise RuntimeError(f"the {channel} run did not start delivering within 180 s")
        t0 = CLOCK.monotonic()
        for event in shared_timeline(setting, rng):
            CLOCK.sleep_blocking(max(0.0, t0 + event.at - CLOCK.monotonic()))
            at = CLOCK.monotonic() - t0
            if event.what == "restart_redis":
                redis.restart(down_for=event.arg)
                detail = f"redis-server restarted without persistence (down {event.arg:g} s)"
            else:
                postgres.restart(down_for=event.arg)
                detail = f"PostgreSQL restarted with pg_ctl -m fast (down {event.arg:g} s)"
            say(f"t+{at:.1f} s {detail}")
            shared_done.append({"at": round(at, 1), "what": event.what, "detail": detail})
        deadline = CLOCK.monotonic() + setting.settle_timeout + 240
        for channel, child in children.items():
            remaining = max(1.0, deadline - CLOCK.monotonic())
            try:
                child.wait(remaining)
            except subprocess.TimeoutExpired:
                say(f"the {channel} run did not finish in time; stopping it")
                child.terminate()
                child.wait(60)
    finally:
        try:
            # A child stops its workers one after the other, each within the budget
            # plus 20 s, so it gets that long for all of them before it is killed.
            for child in children.values():
                if child.poll() is None:
                    child.terminate()
            for child in children.values():
                try:
                    child.wait(CHILD_STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(10)
        finally:
            redis.close()
            postgres.close()

    results = {}
    for channel in channels:
        path = workdir / channel / "result.json"
        results[channel] = json.loads(path.read_text()) if path.exists() else None
    ok = print_table(
        results, shared_done, setting, args.seed, CLOCK.monotonic() - began,
        locks=lock_report(postgres.log),
    )  # fmt: skip
    if args.keep or not ok:
        say(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


def _echo(channel: str, child: subprocess.Popen, started: threading.Event) -> None:
    for line in child.stdout:
        line = line.rstrip("\n")
        if line == "CHAOS-STARTED":
            started.set()
            continue
        print(f"[{channel}] {line}", flush=True)
    started.set()  # the child ended (early, if it never started): do not wait for it


def say(text: str) -> None:
    print(f"[chaos] {text}", flush=True)


VERDICT_ROWS = (
    ("status_disagrees", "arrived, but recorded missed/failed"),
    ("unknown_unexplained", "unknown on http, not as maybe sent and past retrying"),
    ("not_due_messages", "not yet due / cancelled before planning: messages"),
    ("duplicates", "duplicate emails (same attendee, same workshop)"),
    ("lost", "lost (due, no final status; or sent, never arrived)"),
    ("late", "late (arrived after its deadline)"),
    ("late_after_change", "staff change: revoked calls after commit + bound"),
    ("sent_after_cancel", "  of which for a cancelled reminder"),
    ("old_time_after_move", "  of which with a moved workshop's old start"),
    ("notices_duplicates", "change notices received twice"),
    ("notices_after_start", "change notices arriving after their workshop's start"),
    ("notices_unaccounted", "reminded attendees of a changed workshop without a notice outcome"),
)


def verdict(result: dict) -> list[str]:
    """Return the broken promises of one channel run (empty: it passed)."""
    if result is None:
        return ["the run produced no result (see its log)"]
    counts = result["counts"]
    broken = [
        f"{label.strip()} {counts.get(key, '?')}"
        for key, label in VERDICT_ROWS
        if counts.get(key, 1) != 0
    ]
    if not result.get("staff"):
        broken.append("the staff-changes phase committed no change")
    if result["counts"].get("unknown", 0) > result["unknown_allowed"]:
        broken.append(
            f"unknown {result['counts']['unknown']} > {result['unknown_allowed']} allowed"
        )
    if result.get("error"):
        broken.append(result["error"])
    return broken


def print_table(
    results: dict,
    shared: list[dict],
    setting: Setting,
    seed: int,
    elapsed: float,
    locks: dict | None = None,
) -> bool:
    channels = list(results)
    print()
    print(
        f"chaos run, {setting.name} setting, seed {seed}: {setting.reminders} due reminders "
        f"per channel, rate limit {setting.rate}/s, batch budget {setting.budget} s "
        f"(lease {setting.lease} s), scan every 5 s, {os.cpu_count()} CPUs, {elapsed:.0f} s"
    )
    rows = [
        ("due", "reminders due"),
        ("sent", "  sent"),
        ("missed", "  missed"),
        ("failed", "  failed"),
        ("unknown", "  unknown"),
        ("cancelled", "  cancelled"),
        ("planned_missed", "inside the cutoff (planned missed)"),
        ("absorbed", "re-sends absorbed by the idempotency key"),
        ("staff_changes", "staff-changes phase: changes committed"),
        ("staff_in_flight", "  their reminders sending at commit"),
        ("notices", "change notices of the staff phase"),
        ("notices_sent", "  sent"),
        ("notices_missed", "  missed"),
        ("notices_failed", "  failed"),
        ("notices_unknown", "  unknown"),
        *VERDICT_ROWS,
        ("unknown_allowed", "unknown allowed (SIGKILLs x in-flight per worker)"),
    ]
    width = max(len(label) for _, label in rows) + 2
    print(f"{'':<{width}}" + "".join(f"{c:>10}" for c in channels))
    for key, label in rows:
        cells = []
        for channel in channels:
            result = results[channel]
            if result is None:
                cells.append("-")
            elif key == "unknown_allowed":
                cells.append(str(result["unknown_allowed"]))
            else:
                cells.append(str(result["counts"].get(key, "-")))
        print(f"{label:<{width}}" + "".join(f"{cell:>10}" for cell in cells))
    verdicts = {channel: verdict(results[channel]) for channel in channels}
    print(
        f"{'verdict':<{width}}"
        + "".join(f"{'PASS' if not verdicts[c] else 'FAIL':>10}" for c in channels)
    )
    bounds = {
        f"{r['window']:g} s window + {r['slack']:g} s slack"
        for r in results.values()
        if r and "window" in r
    }
    if bounds:
        print(f"  (staff-change bound: commit + {', '.join(sorted(bounds))})")
    for channel in channels:
        result = results[channel]
        if result is None:
            continue
        for kind in ("missed", "failed", "unknown", "notice missed", "notice failed",
                     "notice unknown"):  # fmt: skip
            for reason, count in sorted(result["reasons"].get(kind, {}).items()):
                print(f"  {channel} {kind:<8} {count:>5}  {reason}")
    print("staff changes while sending (arrival times relative to each commit):")
    for channel in channels:
        for line in (results[channel] or {}).get("staff", []):
            print(f"  {channel:<4}  {line}")
    print("faults injected (seconds after the first scan):")
    for fault in shared:
        print(f"  t+{fault['at']:>6.1f}  both  {fault['detail']}")
    for channel in channels:
        result = results[channel]
        for fault in (result or {}).get("faults", []):
            print(f"  t+{fault['at']:>6.1f}  {channel:<4}  {fault['detail']}")
        for note in (result or {}).get("notes", []):
            print(f"  note   {channel:<4}  {note}")
    if locks is not None:
        print(
            f"  note   both  PostgreSQL logged {locks['deadlocks']} deadlocks and "
            f"{locks['waits_over_1s']} lock waits over 1 s"
        )
        for line in locks["first"]:
            print(f"  note   both    {line}")
    for channel, broken in verdicts.items():
        if broken:
            print(f"FAILED {channel}: " + "; ".join(broken))
    summary = {
        c: {"passed": not verdicts[c], **((results[c] or {}).get("counts", {}))} for c in channels
    }
    locked = (
        {"postgres_locks": {k: locks[k] for k in ("deadlocks", "waits_over_1s")}} if locks else {}
    )
    print(json.dumps({"chaos": summary, **locked, "passed": not any(verdicts.values())}))
    return not any(verdicts.values())


# =============================================================================
# One channel run (a child process): Django, seed, processes, faults, counts.
# =============================================================================


class ChannelRun:
    """One channel's run in its own process: seed, start, inject, wait, count."""

    def __init__(self, channel: str, setting: Setting, args) -> None:
        self.channel = channel
        self.setting = setting
        self.seed = args.seed
        self.rng = random.Random(f"{args.seed}-{channel}")
        self.dir: Path = args.run_dir
        self.logs = self.dir / "logs"
        self.database_url = args.database_url
        self.broker_url = args.broker_url
        self.workers: list[Proc] = []
        self.retired: list[Proc] = []
        self.beats: list[Proc] = []
        self.worker_number = 0
        self.faults: list[dict] = []
        self.notes: list[str] = []
        self.kills = 0
        self.killed: dict[str, datetime] = {}  # worker name -> when it was SIGKILLed
        self.threads: list[threading.Thread] = []
        self.t0 = 0.0
        self.groups: dict[str, set[int]] = defaultdict(set)
        self.exited: set[str] = set()
        # Every cancel and move the driver commits, with when it committed.
        self.changes: list[dict] = []

    # -- plumbing ------------------------------------------------------------

    def log(self, text: str) -> None:
        at = CLOCK.monotonic() - self.t0 if self.t0 else 0.0
        print(f"{at:7.1f}s {text}", flush=True)

    def fault(self, detail: str) -> None:
        at = CLOCK.monotonic() - self.t0
        self.faults.append({"at": round(at, 1), "detail": detail})
        self.log(detail)

    def db(self, job, *, attempts: int = 60, errors: list[str] | None = None):
        """Run ``job`` against the database, riding out a PostgreSQL restart.

        Each error ridden out is appended to ``errors`` (its type and first line).
        """
        from django.db import InterfaceError, OperationalError, connection

        for attempt in range(attempts):
            try:
                return job()
            except (OperationalError, InterfaceError) as exc:
                if errors is not None:
                    first = (str(exc).strip().splitlines() or [""])[0]
                    errors.append(f"{type(exc).__name__}: {first}")
                connection.close()
                if attempt == attempts - 1:
                    raise
                CLOCK.sleep_blocking(0.5)
        return None

    def start_worker(self) -> Proc:
        self.worker_number += 1
        proc = celery_worker(self.env, f"w{self.worker_number}", self.logs, concurrency=POOL)
        self.workers.append(proc)
        return proc

    def start_beat(self, name: str) -> Proc:
        proc = celery_beat(self.env, name, self.logs)
        self.beats.append(proc)
        return proc

    # -- the run -------------------------------------------------------------

    def run(self) -> int:
        self.sink = (
            SinkProcess("smtp", self.logs)
            if self.channel == "smtp"
            else SinkProcess("http", self.logs, "--secret", HTTP_SECRET)
        )
        self.env = worker_env(
            self.channel,
            self.setting,
            database_url=self.database_url,
            broker_url=self.broker_url,
            sink_address=self.sink.address,
            var_dir=self.dir / "var",
            seed=self.seed,
        )
        os.environ.update(self.env)
        os.environ["LOG_LEVEL"] = "WARNING"  # the driver's own log; workers log at INFO
        import django

        django.setup()
        from django.db import close_old_connections

        result: dict = {"channel": self.channel}
        try:
            self.seed_data()
            beat = self.start_beat("beat1")
            for _ in range(2):
                self.start_worker()
            for proc in [beat, *self.workers]:
                proc.wait_for("beat: Starting" if proc is beat else " ready.", timeout=120)
            self.wait_first_scan()
            self.t0 = CLOCK.monotonic()
            print("CHAOS-STARTED", flush=True)
            self.log(f"first scan done; delivering through {self.channel}")
            self.cancel_after_queueing()
            for event in channel_timeline(self.setting, self.rng):
                CLOCK.sleep_blocking(max(0.0, self.t0 + event.at - CLOCK.monotonic()))
                self.check_processes()
                close_old_connections()  # PostgreSQL may have been restarted meanwhile
                getattr(self, f"do_{event.what}")(event)
            for thread in self.threads:
                thread.join(self.setting.budget + 120)
            self.wait_settled()
            CLOCK.sleep_blocking(3)  # anything still on the wire arrives now
            result.update(self.collect())
        except Exception as exc:  # the table must still say what happened
            import traceback

            traceback.print_exc(file=sys.stdout)
            result.update(self.collect_safely())
            result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            for proc in self.workers + self.beats:
                proc.stop(timeout=self.setting.budget + 20)
            self.sink.close()
        from reminders.services.watch import REVOCATION_WINDOW

        result["faults"] = self.faults
        result["notes"] = self.notes
        result["window"] = REVOCATION_WINDOW
        result["slack"] = ARRIVAL_SLACK
        result["unknown_allowed"] = self.kills * per_worker_in_flight(self.channel, self.setting)
        (self.dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
        return 0

    def seed_data(self) -> None:
        from workshops.models import Attendee, Enrollment, Workshop
        from workshops.services import enrollment_cancel, workshop_cancel

        zones = [
            "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney",
            "America/Sao_Paulo", "Asia/Kolkata", "UTC",
        ]  # fmt: skip
        per = self.setting.per_workshop
        now = CLOCK.now()
        due_workshops = math.ceil(self.setting.reminders / per)
        plan: list[tuple[str, timedelta, int]] = [
            ("due", timedelta(hours=1) + i * timedelta(hours=18) / due_workshops, per)
            for i in range(due_workshops)
        ]
        plan += [
            ("cutoff", timedelta(minutes=12), per // 2),
            ("cutoff", timedelta(minutes=20), per // 2),
            ("later", timedelta(hours=26), per // 2),
            ("later", timedelta(hours=30), per // 2),
            ("cancelled_before", timedelta(hours=5), per // 2),
        ]
        workshops = Workshop.objects.bulk_create(
            Workshop(
                title=f"Chaos {self.channel} {group} {number}",
                starts_at=now + offset + timedelta(seconds=self.rng.randint(0, 600)),
                ends_at=now + offset + timedelta(hours=2),
                timezone=zones[number % len(zones)],
            )
            for number, (group, offset, _) in enumerate(plan)
        )
        pool = max(3 * per, self.setting.reminders // 3)
        people = Attendee.objects.bulk_create(
            Attendee(name=f"Person {i}", email=f"person{i}@example.com") for i in range(pool)
        )
        self.tight_people = Attendee.objects.bulk_create(
            Attendee(name=f"Late Person {i}", email=f"late{i}@example.com") for i in range(2 * per)
        )
        enrollments = []
        for workshop, (group, _, count) in zip(workshops, plan, strict=True):
            self.groups[group].add(workshop.pk)
            for person in self.rng.sample(people, count):
                enrollments.append(Enrollment(attendee=person, workshop=workshop))
        Enrollment.objects.bulk_create(enrollments)
        # Cancelled before any reminder exists: the plan must never create one.
        for workshop in workshops:
            if workshop.pk in self.groups["cancelled_before"]:
                self.commit(
                    "cancel", f"cancelled workshop {workshop.pk} before planning",
                    lambda workshop=workshop: workshop_cancel(workshop=workshop),
                    workshop=workshop.pk,
                )  # fmt: skip
        first_due = Workshop.objects.filter(pk__in=self.groups["due"]).order_by("starts_at")[0]
        for enrollment in Enrollment.objects.filter(workshop=first_due)[:3]:
            self.commit(
                "cancel", f"cancelled enrollment {enrollment.pk} before planning",
                lambda enrollment=enrollment: enrollment_cancel(enrollment=enrollment),
                workshop=first_due.pk, enrollments=[enrollment.pk],
            )  # fmt: skip
        self.log(
            f"seeded {len(workshops)} workshops in {len(zones)} zones, {len(enrollments)} "
            f"enrollments ({sum(c for g, _, c in plan if g == 'due') - 3} due)"
        )

    def wait_first_scan(self) -> None:
        from reminders.models import Reminder

        wait_until(
            lambda: self.db(lambda: Reminder.objects.filter(status="queued").exists()),
            timeout=120,
            what="the first scan to queue reminders",
            interval=0.2,
        )

    def cancel_after_queueing(self) -> None:
        """Cancel the latest workshop and five enrollments while their reminders are queued."""
        from workshops.models import Enrollment, Workshop
        from workshops.services import enrollment_cancel, workshop_cancel

        due = list(Workshop.objects.filter(pk__in=self.groups["due"]).order_by("-starts_at")[:2])
        self.commit(
            "cancel", f"cancelled workshop {due[0].pk} (queued)",
            lambda: workshop_cancel(workshop=due[0]), workshop=due[0].pk,
        )  # fmt: skip
        for enrollment in Enrollment.objects.filter(workshop=due[1])[:5]:
            self.commit(
                "cancel", f"cancelled enrollment {enrollment.pk} (queued)",
                lambda enrollment=enrollment: enrollment_cancel(enrollment=enrollment),
                workshop=due[1].pk, enrollments=[enrollment.pk],
            )  # fmt: skip
        self.fault(f"cancelled workshop {due[0].pk} and 5 enrollments of {due[1].pk} (queued)")

    def commit(self, kind: str, label: str, service, *, workshop: int, **facts) -> dict:
        """Run one staff change (a workshops.services call) and record when it committed.

        The service owns its transaction and returns right after COMMIT, so
        the clocks read on return bound the commit from above (by far less
        than the slack); ``began`` bounds it from below. Monotonic time is
        what the sinks stamp (CLOCK_MONOTONIC: one clock for every process
        on the host); the wall time is for the table.
        """
        began = CLOCK.monotonic()
        retried: list[str] = []
        self.db(service, errors=retried)
        committed = CLOCK.monotonic()
        wall = CLOCK.now()
        change = {
            "kind": kind,
            "label": label,
            "workshop": workshop,
            "enrollments": facts.pop("enrollments", None),
            "began": began,
            "committed": committed,
            "committed_wall": wall,
            "retried": retried,
            "at": committed - self.t0 if self.t0 else 0.0,
            **facts,
        }
        self.changes.append(change)
        return change

    def enrol_racing_move(self, workshop_id: int, new: datetime) -> None:
        """Enrol a new attendee in a transaction that commits after a move of its workshop.

        The enrolment plans its reminder from the start it read; the move
        commits in between, inside the cutoff. Whatever the enrolment read,
        its reminder must not be sent (its claim reads the workshop now).
        """
        from django.db import connection, transaction

        from workshops.models import Attendee, Workshop
        from workshops.services import enrollment_create, workshop_update

        enrolled, moved = threading.Event(), threading.Event()
        failed: list[BaseException] = []

        def enrol() -> None:
            try:
                with transaction.atomic():
                    person = Attendee.objects.create(
                        name="Racing Person", email=f"race-{self.channel}-{workshop_id}@example.com"
                    )
                    enrollment_create(
                        attendee=person, workshop=Workshop.objects.get(pk=workshop_id)
                    )
                    enrolled.set()
                    moved.wait(10)
            except BaseException as exc:  # reported by the caller
                failed.append(exc)
                enrolled.set()
            finally:
                connection.close()

        racer = threading.Thread(target=enrol)
        racer.start()
        enrolled.wait(10)
        try:
            workshop_update(
                workshop=Workshop.objects.get(pk=workshop_id),
                starts_at=new,
                ends_at=new + timedelta(hours=1),
            )
        finally:
            moved.set()
            racer.join(30)
        if failed:
            raise failed[0]

    def staff_snapshot(self, workshop_ids) -> dict[int, Counter]:
        """Return the reminders' statuses of each workshop (one query)."""
        from reminders.models import Reminder

        rows = self.db(
            lambda: list(
                Reminder.objects.filter(workshop_id__in=list(workshop_ids)).values_list(
                    "workshop_id", "status"
                )
            )
        )
        by: dict[int, Counter] = defaultdict(Counter)
        for workshop_id, status in rows:
            by[workshop_id][status] += 1
        return by

    def do_staff(self, event: Event) -> None:
        """Cancel, cancel enrollments and move workshops while their reminders are being sent.

        Seven dedicated workshops start at the same time with the same
        attendees, enrolled in turn so their reminders interleave in every
        batch and claim. Each change commits once its workshop has a
        reminder ``sending`` and one already sent (or, after a third of
        ``staff_wait``, one sending; after all of it, as things are).
        """
        from reminders.models import Reminder
        from reminders.policy import ReminderPolicy
        from workshops.models import Attendee, Enrollment, Workshop
        from workshops.services import (
            enrollment_cancel,
            enrollment_create,
            workshop_cancel,
            workshop_create,
            workshop_update,
        )

        count = self.setting.staff_per_workshop
        people = self.db(
            lambda: Attendee.objects.bulk_create(
                [
                    Attendee(name=f"Staff Person {i}", email=f"staff{i}@example.com")
                    for i in range(count)
                ]
            )
        )
        start = (CLOCK.now() + timedelta(hours=2)).replace(second=0, microsecond=0)
        workshops = {}
        for name, zone in STAFF_WORKSHOPS:
            workshops[name] = self.db(
                lambda name=name, zone=zone: workshop_create(
                    title=f"Chaos {self.channel} staff {name}",
                    starts_at=start,
                    duration=timedelta(hours=1),
                    timezone=zone,
                )
            )
            self.groups["staff"].add(workshops[name].pk)
        for person in people:
            for workshop in workshops.values():
                self.db(
                    lambda person=person, workshop=workshop: enrollment_create(
                        attendee=person, workshop=workshop
                    )
                )
        self.provider(
            {"data_delay": STAFF_PROVIDER_DELAY},
            {"delay": STAFF_PROVIDER_DELAY},
            f"staff phase: {len(workshops)} workshops x {count} attendees starting "
            f"{start:%H:%M} UTC; provider answers after {STAFF_PROVIDER_DELAY:g} s",
        )
        policy = ReminderPolicy.from_settings()
        ids = {workshop.pk for workshop in workshops.values()}
        waiting_since = CLOCK.monotonic()
        pending = [name for name, _ in STAFF_WORKSHOPS]
        while pending:
            waited = CLOCK.monotonic() - waiting_since
            snapshot = self.staff_snapshot(ids)
            for name in list(pending):
                workshop = workshops[name]
                now_statuses = snapshot.get(workshop.pk, Counter())
                sending, sent = now_statuses["sending"], now_statuses["sent"]
                ready = sending and (sent or waited > self.setting.staff_wait / 3)
                if not ready and waited < self.setting.staff_wait:
                    continue
                pending.remove(name)
                at_commit = self.staff_snapshot([workshop.pk]).get(workshop.pk, Counter())
                shown = ", ".join(
                    f"{at_commit[s]} {s}" for s in ("sending", "queued", "pending", "sent")
                )
                if not ready:
                    self.notes.append(f"staff {name}: committed without a reminder in flight")
                if name == "cancel":
                    self.commit(
                        "cancel", f"cancelled workshop {workshop.pk} ({shown})",
                        lambda workshop=workshop: workshop_cancel(workshop=workshop),
                        workshop=workshop.pk, phase=True, sending=at_commit["sending"],
                    )  # fmt: skip
                elif name == "enrollments":
                    candidates = self.db(
                        lambda workshop=workshop: list(
                            Reminder.objects.filter(
                                workshop=workshop, status__in=list(UNSENT_RANK)
                            ).values_list("status", "enrollment_id")
                        )
                    )
                    candidates.sort(key=lambda pair: UNSENT_RANK[pair[0]])
                    for status, enrollment_id in candidates[:2]:
                        enrollment = self.db(
                            lambda enrollment_id=enrollment_id: Enrollment.objects.get(
                                pk=enrollment_id
                            )
                        )
                        self.commit(
                            "cancel",
                            f"cancelled enrollment {enrollment_id} of workshop {workshop.pk}, "
                            f"its reminder {status} ({shown})",
                            lambda enrollment=enrollment: enrollment_cancel(enrollment=enrollment),
                            workshop=workshop.pk, enrollments=[enrollment_id], phase=True,
                            sending=int(status == "sending"),
                        )  # fmt: skip
                else:
                    old = start
                    if name == "earlier":
                        new = old - timedelta(hours=1)
                    elif name == "later":
                        new = old + timedelta(hours=3)
                    else:  # inside the cutoff: its deadline has passed already
                        new = CLOCK.now() + policy.cutoff - timedelta(minutes=10)
                    if name == "bulk-inside":

                        def service(workshop=workshop, new=new):
                            Workshop.objects.filter(pk=workshop.pk).update(
                                starts_at=new, ends_at=new + timedelta(hours=1)
                            )

                    elif name == "enrol-race":

                        def service(workshop=workshop, new=new):
                            self.enrol_racing_move(workshop.pk, new)

                    else:

                        def service(workshop=workshop, new=new):
                            workshop_update(
                                workshop=workshop, starts_at=new, ends_at=new + timedelta(hours=1)
                            )

                    self.commit(
                        "move",
                        f"moved workshop {workshop.pk} {name} "
                        f"({(new - old).total_seconds() / 60:+.0f} min; {shown})",
                        service,
                        workshop=workshop.pk, phase=True, sending=at_commit["sending"],
                        old_start=old, new_start=new, zone=workshop.timezone,
                        sendable=new - policy.cutoff > CLOCK.now(),
                        old_deadline=policy.deadline_at(old),
                    )  # fmt: skip
            if pending:
                CLOCK.sleep_blocking(0.05)
        for change in self.changes:
            if change.get("phase"):
                detail = (
                    f"staff: {change['label']}; committed {change['committed_wall']:%H:%M:%S.%f}"[
                        :-3
                    ]
                    + f" UTC, the service took {(change['committed'] - change['began']) * 1000:.0f} ms"
                    + (
                        f" (retried after {'; '.join(change['retried'])})"
                        if change["retried"]
                        else ""
                    )
                )
                self.faults.append({"at": round(change["at"], 1), "detail": detail})
                self.log(detail)
        from reminders.services.watch import REVOCATION_WINDOW

        last = max(change["committed"] for change in self.changes if change.get("phase"))
        CLOCK.sleep_blocking(max(0.0, last + REVOCATION_WINDOW + ARRIVAL_SLACK - CLOCK.monotonic()))
        self.provider({"data_delay": 0.0}, {"delay": 0.0}, "staff phase: provider delay off")

    # -- faults ----------------------------------------------------------------

    def in_flight(self, proc: Proc, *, claimed_after=None) -> int:
        """Count the claims ``proc`` holds in flight (claimed after ``claimed_after``, if given).

        Claims stranded earlier (their batch was terminated, say by a Redis
        restart) stay in flight until the reaper; ``claimed_after`` leaves
        them out, so a SIGTERM is judged by the batch it interrupted.
        """
        from reminders.models import DeliveryAttempt

        attempts = DeliveryAttempt.objects.filter(
            worker__startswith=f"{proc.name}@", outcome="in_flight"
        )
        if claimed_after is not None:
            attempts = attempts.filter(claimed_at__gte=claimed_after)
        return self.db(attempts.count)

    def pick_victim(self) -> Proc:
        """Pick a live worker at random, preferring one that holds a claim right now."""
        live = [proc for proc in self.workers if proc.alive]
        victim = self.rng.choice(live)
        try:
            wait_until(lambda: self.in_flight(victim) > 0, timeout=8, what="a claim", interval=0.05)
        except TimeoutError:
            pass
        return victim

    def do_sigkill(self, event: Event) -> None:
        victim = self.pick_victim()
        killed_at = CLOCK.now()
        victim.signal_group(signal.SIGKILL)
        victim.wait(10)
        held = self.in_flight(victim)
        self.workers.remove(victim)
        self.retired.append(victim)
        self.kills += 1
        self.killed[victim.name] = killed_at
        replacement = self.start_worker()
        self.fault(
            f"SIGKILL {victim.name} (whole process group) holding {held} claims in flight; "
            f"started {replacement.name}"
        )

    def do_sigterm(self, event: Event) -> None:
        victim = self.pick_victim()
        live_since = CLOCK.now() - timedelta(seconds=self.setting.budget)
        held = self.in_flight(victim, claimed_after=live_since)
        victim.signal_main(signal.SIGTERM)
        sent_at = CLOCK.monotonic()
        self.workers.remove(victim)
        self.retired.append(victim)
        replacement = self.start_worker()
        self.fault(
            f"SIGTERM {victim.name} (main process, warm shutdown) holding {held} claims; "
            f"started {replacement.name}"
        )
        # A batch's longest healthy run (budget, drain, close, record), plus start-up slack.
        limit = math.ceil(self.setting.bounds.work) + 30

        def watch() -> None:
            code = victim.wait(limit)
            took = CLOCK.monotonic() - sent_at
            if code is None:
                self.notes.append(
                    f"{victim.name} still running {limit} s after SIGTERM (hang); killed"
                )
                victim.signal_group(signal.SIGKILL)
                return
            left = self.in_flight(victim, claimed_after=live_since)
            self.notes.append(
                f"{victim.name} exited {took:.1f} s after SIGTERM (code {code}), "
                f"{left} of its live claims left in flight (C3 wants 0)"
            )

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        self.threads.append(thread)

    def do_beat2_start(self, event: Event) -> None:
        self.start_beat("beat2")
        self.fault("second beat started")

    def do_beat2_stop(self, event: Event) -> None:
        beat2 = next(proc for proc in self.beats if proc.name == "beat2")
        scans = beat2.count("Sending due task")
        beat2.stop(timeout=20)
        self.beats.remove(beat2)
        self.retired.append(beat2)
        self.fault(f"second beat stopped (it published {scans} scans)")

    def provider(self, smtp: dict, http: dict, detail: str) -> None:
        self.sink.control(**(smtp if self.channel == "smtp" else http))
        self.fault(detail)

    def do_slow(self, event: Event) -> None:
        self.provider({"data_delay": 1.0}, {"delay": 1.0}, "provider slow: 1 s per message")

    def do_fail_5xx(self, event: Event) -> None:
        self.provider(
            {"data_delay": 0.0, "fail_reply": SMTP_5XX},
            {"delay": 0.0, "fail_status": 503, "retry_after": 1},
            "provider failing: " + (SMTP_5XX if self.channel == "smtp" else "503, Retry-After 1"),
        )

    def do_fail_429(self, event: Event) -> None:
        self.provider(
            {"fail_reply": SMTP_429},
            {"fail_status": 429, "retry_after": 1},
            "provider throttling: "
            + (SMTP_429 if self.channel == "smtp" else "429, Retry-After 1"),
        )

    def do_healthy(self, event: Event) -> None:
        self.provider(
            {"fail_reply": None},
            {"fail_status": None, "retry_after": None},
            "provider healthy again",
        )

    def do_permanent(self, event: Event) -> None:
        self.provider(
            {"reply_to_data": [SMTP_PERMANENT] * 3},
            {"fail_status": 422, "fail_next": 3},
            "provider refuses the next 3 messages permanently ("
            + (SMTP_PERMANENT if self.channel == "smtp" else "422")
            + ")",
        )

    def do_tight(self, event: Event) -> None:
        """Enrol attendees (T6) in two workshops whose deadlines fall inside the outage."""
        from workshops.services import enrollment_create, workshop_create

        per = self.setting.per_workshop
        outage = event.arg
        cutoff = timedelta(minutes=30)
        for number, within in enumerate((1.5 * outage, 3 * outage + 20)):
            workshop = self.db(
                lambda within=within, number=number: workshop_create(
                    title=f"Chaos {self.channel} tight {number}",
                    starts_at=CLOCK.now() + cutoff + timedelta(seconds=within),
                    duration=timedelta(hours=1),
                    timezone="America/New_York",
                )
            )
            self.groups["tight"].add(workshop.pk)
            for person in self.tight_people[number * per : (number + 1) * per]:
                self.db(
                    lambda person=person, workshop=workshop: enrollment_create(
                        attendee=person, workshop=workshop
                    )
                )
        self.fault(
            f"enrolled {2 * per} attendees in 2 workshops whose deadlines are "
            f"{1.5 * outage:.0f} s and {3 * outage + 20:.0f} s away"
        )

    def check_processes(self) -> None:
        for proc in self.workers + self.beats:
            if not proc.alive and proc.name not in self.exited:
                self.exited.add(proc.name)
                self.notes.append(
                    f"{proc.name} exited unexpectedly (code {proc.popen.returncode}); "
                    f"last lines in {proc.log_path}"
                )
                self.log(f"{proc.name} exited unexpectedly:\n{proc.tail(15)}")

    # -- the end ---------------------------------------------------------------

    def wait_settled(self) -> None:
        """Wait until no reminder is open; give up early when nothing moves any more.

        Nothing can legitimately stay still longer than a lease plus two
        scans' requeue (a stranded claim waits for its lease, then the
        reaper and a new batch need a few seconds): past that, an open row
        is stuck, and waiting the whole timeout would only delay the verdict.
        """
        from reminders.models import Notice, Reminder
        from reminders.services.notices import reminders_owed_notice

        def open_rows() -> dict[str, int]:
            def read() -> dict[str, int]:
                found = Counter(
                    Reminder.objects.filter(
                        status__in=["pending", "queued", "sending"]
                    ).values_list("status", flat=True)
                )
                found.update(
                    f"notice {status}"
                    for status in Notice.objects.filter(
                        status__in=["pending", "sending"]
                    ).values_list("status", flat=True)
                )
                # A change the scans have not turned into notices yet (settling).
                found["owed a notice"] = reminders_owed_notice(clock=CLOCK).count()
                return {name: n for name, n in found.items() if n}

            return self.db(read)

        began = CLOCK.monotonic()
        stillness = self.setting.lease + 60
        last, moved_at = None, began
        while True:
            self.check_processes()
            now_open = open_rows()
            now = CLOCK.monotonic()
            if not now_open:
                self.log(
                    f"every reminder and notice final {now - began:.0f} s after the last fault"
                )
                return
            statuses = self.db(
                lambda: (
                    tuple(
                        sorted(Counter(Reminder.objects.values_list("status", flat=True)).items())
                    ),
                    tuple(sorted(Counter(Notice.objects.values_list("status", flat=True)).items())),
                )
            )
            if statuses != last:
                last, moved_at = statuses, now
            if now - moved_at > stillness or now - began > self.setting.settle_timeout:
                self.notes.append(
                    f"not settled {now - began:.0f} s after the last fault (no status changed "
                    f"for {now - moved_at:.0f} s); still open: {now_open}"
                )
                return
            CLOCK.sleep_blocking(1)

    def unknown_causes(self) -> dict[str, int]:
        """Attribute each lease-expired ``unknown`` to what ended its batch.

        A claim taken by a worker within one batch budget before that worker
        was SIGKILLed is the kill's; any other expired claim belonged to a
        batch that ended without recording while its worker lived on: the
        task failed (PostgreSQL gone between claim and record, C7) or Celery
        terminated it (broker connection lost).
        """
        from reminders.models import DeliveryAttempt

        holders = self.db(
            lambda: list(
                DeliveryAttempt.objects.filter(
                    reminder__status="unknown", outcome="lease_expired"
                ).values_list("worker", "claimed_at")
            )
        )
        window = timedelta(seconds=self.setting.budget + 5)
        causes: Counter = Counter()
        for worker, claimed_at in holders:
            killed_at = self.killed.get(worker.split("@")[0])
            if killed_at is not None and killed_at - window <= claimed_at <= killed_at:
                causes["claimed just before a SIGKILL"] += 1
            else:
                causes["batch ended unrecorded on a live worker"] += 1
        return dict(causes)

    def task_errors(self) -> Counter:
        """Count the task failures the workers logged, by task and error (first words)."""
        pattern = re.compile(
            r"Task (\S+?)\[[^\]]+\] raised unexpected: (\w+)\(['\"]?([^\\\n]{0,80})"
        )
        errors: Counter = Counter()
        for proc in self.workers + self.retired:
            for task, kind, message in pattern.findall(proc.text()):
                errors[(task, f"{kind}: " + message.strip(" '\""))] += 1
        return errors

    def collect_safely(self) -> dict:
        try:
            return self.collect()
        except Exception as exc:
            return {"counts": {"error": str(exc)}, "reasons": {}}

    def collect(self) -> dict:
        from delivery.message import message_id_for
        from reminders.content import sender_domain
        from reminders.models import Notice, Reminder
        from reminders.policy import ReminderPolicy
        from reminders.services.watch import REVOCATION_WINDOW
        from workshops.models import Workshop

        policy = ReminderPolicy.from_settings()
        rows = self.db(
            lambda: list(
                Reminder.objects.values(
                    "key", "status", "status_reason", "workshop__starts_at", "workshop_id",
                    "enrollment_id", "attendee__email", "workshop__title",
                )
            )
        )  # fmt: skip
        notice_rows = self.db(
            lambda: {
                row["key"]: row
                for row in Notice.objects.values(
                    "key", "status", "status_reason", "workshop__starts_at", "workshop_id"
                )
            }
        )
        # notice key -> arrival times of its accepted messages
        notice_arrivals: dict[str, list[float]] = defaultdict(list)
        # Arrivals are CLOCK_MONOTONIC readings of the sink process; deadlines
        # are wall time. One offset, read now, converts (wall = monotonic + offset).
        offset = CLOCK.now().timestamp() - CLOCK.monotonic()
        by_key = {row["key"]: row for row in rows}
        # key -> (arrival, content) of accepted messages; content is what says
        # which start time the message carried (smtp: Subject; http: payload starts_at).
        arrivals: dict[str, list[tuple[float, str | None]]] = defaultdict(list)
        # key -> (arrival, content) of every call the sink saw (http: any answer, re-sends too).
        calls: dict[str, list[tuple[float, str | None]]] = defaultdict(list)
        pairs: Counter = Counter()  # (recipient, workshop) -> accepted messages
        titles: Counter = Counter()  # subject (smtp) or title (http) of accepted messages
        absorbed = 0
        if self.channel == "smtp":
            domain = sender_domain()
            key_of = {message_id_for(key, domain).strip("<>"): key for key in by_key}
            notice_of = {message_id_for(key, domain).strip("<>"): key for key in notice_rows}
            for record in self.sink.records():
                message_id = (record.get("message_id") or "").strip("<>")
                if message_id in notice_of:
                    notice_arrivals[notice_of[message_id]].append(record["arrived_at"])
                    continue
                titles[record.get("subject")] += 1
                key = key_of.get(message_id)
                if key is None:
                    pairs[("?", record.get("subject"))] += 1
                    continue
                seen = (record["arrived_at"], record.get("subject"))
                arrivals[key].append(seen)
                calls[key].append(seen)
                for recipient in record["rcpt_tos"]:
                    pairs[(recipient.lower(), by_key[key]["workshop_id"])] += 1
        else:
            for record in self.sink.records():
                if record["key"] in notice_rows:
                    if record["status"] == 200 and not record["duplicate"]:
                        notice_arrivals[record["key"]].append(record["arrived_at"])
                    continue
                seen = (record["arrived_at"], record.get("starts_at"))
                if record["key"] in by_key:
                    calls[record["key"]].append(seen)
                if record["status"] != 200:
                    continue
                if record["duplicate"]:
                    absorbed += 1
                    continue
                titles[record["title"]] += 1
                if record["key"] not in by_key:
                    pairs[("?", record["title"])] += 1
                    continue
                arrivals[record["key"]].append(seen)
                pairs[((record["email"] or "").lower(), by_key[record["key"]]["workshop_id"])] += 1
        from reminders.services import reasons as why

        maybe_sent = why.MAYBE_SENT_NOT_RETRIED.split("{why}")[0]
        counts: Counter = Counter()
        staff_lines, moved = self.judge_changes(
            rows, arrivals, calls, counts, bound=REVOCATION_WINDOW + ARRIVAL_SLACK
        )
        not_due = self.db(
            lambda: set(
                Workshop.objects.filter(
                    pk__in=self.groups["later"] | self.groups["cancelled_before"]
                ).values_list("title", flat=True)
            )
        )
        reasons: dict[str, Counter] = defaultdict(Counter)
        late_by: list[float] = []
        for row in rows:
            key, status = row["key"], row["status"]
            got = arrivals.get(key, [])
            # The workshop's current cutoff: a row stores no copy of it.
            deadline = policy.deadline_at(row["workshop__starts_at"]).timestamp()
            for arrived, _ in got:
                # A moved workshop's calls up to the bound were made under its old deadline.
                limit = deadline
                if key in moved and arrived <= moved[key][0]:
                    limit = moved[key][1]
                if arrived + offset >= limit:
                    counts["late"] += 1
                    late_by.append(arrived + offset - limit)
            if row["workshop_id"] in self.groups["cutoff"]:
                # Never sendable (its deadline had passed when it was planned):
                # any arrival is after its deadline, counted as late above.
                counts["planned_missed"] += 1
                continue
            counts["due"] += 1
            counts[status] += 1
            if status in ("missed", "failed", "unknown"):
                reasons[status][row["status_reason"][:90]] += 1
            if status == "unknown" and self.channel == "http":
                # A keyed reminder is unknown only once it cannot be tried again.
                if not row["status_reason"].startswith(maybe_sent):
                    counts["unknown_unexplained"] += 1
            if status not in Reminder.FINAL_STATUSES:
                counts["lost"] += 1
            elif status == "sent" and not got:
                counts["lost"] += 1
            if status in ("missed", "failed") and got:
                counts["status_disagrees"] += 1
                if counts["status_disagrees"] <= NOTES_PER_KIND:
                    self.notes.append(
                        f"{status} but arrived: reminder key {key} ({row['workshop__title']}), "
                        f"{len(got)} message(s); status reason: {row['status_reason'][:80]}"
                    )
            if status == "cancelled" and got:
                # Sent before the cancel committed (judged by time in judge_changes).
                counts["cancelled_with_message"] += 1
        counts["duplicates"] = sum(n - 1 for n in pairs.values() if n > 1)
        self.judge_notices(notice_rows, notice_arrivals, counts, reasons, offset=offset)
        by_cause = self.unknown_causes()
        if by_cause:
            self.notes.append(
                "unknown by whose lease expired: "
                + ", ".join(f"{cause} {count}" for cause, count in by_cause.items())
            )
        counts["absorbed"] = absorbed if self.channel == "http" else "-"
        counts["not_due_messages"] = sum(
            n for subject, n in titles.items() if subject and any(t in subject for t in not_due)
        )
        unmatched = sum(n for (who, _), n in pairs.items() if who == "?")
        if unmatched:
            self.notes.append(f"{unmatched} messages matched no reminder")
            counts["duplicates"] += unmatched
        if counts["cancelled_with_message"]:
            self.notes.append(
                f"{counts['cancelled_with_message']} reminders recorded cancelled although a "
                "message arrived (before the cancel's bound)"
            )
        for (task, error), count in sorted(self.task_errors().items()):
            self.notes.append(f"{count} x {task} raised {error}")
        if late_by:
            self.notes.append(f"latest arrival {max(late_by) * 1000:.0f} ms after its deadline")
        for key in (
            "sent", "missed", "failed", "unknown", "cancelled", "lost", "late", "status_disagrees",
            "unknown_unexplained",
            "late_after_change", "sent_after_cancel", "old_time_after_move", "not_due_messages",
            "staff_changes", "staff_in_flight", "notices", "notices_sent", "notices_missed",
            "notices_failed", "notices_unknown", "notices_duplicates", "notices_after_start",
            "notices_unaccounted",
        ):  # fmt: skip
            counts.setdefault(key, 0)
        return {
            "counts": dict(counts),
            "reasons": {k: dict(v) for k, v in reasons.items()},
            "staff": staff_lines,
        }

    def judge_notices(
        self, rows: dict, arrivals: dict, counts: Counter, reasons: dict, *, offset: float
    ) -> None:
        """Count the change notices: each received once, none after its workshop's start (as
        it is now), and every reminded attendee of a changed workshop accounted for."""
        from reminders.services.notices import reminders_owed_notice

        for key, row in rows.items():
            counts["notices"] += 1
            counts[f"notices_{row['status']}"] += 1
            if row["status"] in ("missed", "failed", "unknown"):
                reasons[f"notice {row['status']}"][row["status_reason"][:90]] += 1
            if row["status"] in ("pending", "sending"):
                counts["notices_unaccounted"] += 1
            got = arrivals.get(key, [])
            counts["notices_duplicates"] += max(0, len(got) - 1)
            start = row["workshop__starts_at"].timestamp()
            counts["notices_after_start"] += sum(1 for at in got if at + offset >= start)
            if row["status"] == "sent" and not got:
                counts["notices_unaccounted"] += 1
        owed = self.db(lambda: reminders_owed_notice(clock=CLOCK).count())
        counts["notices_unaccounted"] += owed
        if owed:
            self.notes.append(f"{owed} reminded attendees still owed a change notice")

    def carries(self, content: str | None, start: datetime, zone: str) -> bool:
        """Say whether a message's content shows ``start`` (as reminders.content renders it)."""
        from reminders.content import local_start

        if not content:
            return False
        if self.channel == "smtp":  # the subject: "... starts <local time> <zone abbr>"
            return local_start(start, ZoneInfo(zone)) in content
        return content == start.astimezone(UTC).isoformat()

    def judge_changes(
        self, rows: list[dict], arrivals: dict, calls: dict, counts: Counter, *, bound: float
    ) -> tuple[list[str], dict[str, tuple[float, float]]]:
        """Count the calls each committed change should have stopped; describe the phase's changes.

        A change's bound is its commit (monotonic, the sinks' clock) plus
        ``bound`` (the revocation window plus the arrival slack). After it,
        no call may reach the sink for an affected reminder carrying what the
        change revoked: for a cancel, any call; for a move into the cutoff,
        any call; for another move, a call that does not show the new start.
        Returns one line per change of the staff phase, and for each moved
        reminder (bound, old deadline) so late arrivals are judged by the
        deadline in force when the call started.
        """
        keys_of_workshop: dict[int, set[str]] = defaultdict(set)
        key_of_enrollment: dict[int, str] = {}
        status_of = {}
        for row in rows:
            keys_of_workshop[row["workshop_id"]].add(row["key"])
            key_of_enrollment[row["enrollment_id"]] = row["key"]
            status_of[row["key"]] = row["status"]
        lines: list[str] = []
        moved: dict[str, tuple[float, float]] = {}
        for change in self.changes:
            committed = change["committed"]
            until = committed + bound
            if change["enrollments"] is not None:
                keys = {
                    key_of_enrollment[e] for e in change["enrollments"] if e in key_of_enrollment
                }
            else:
                keys = keys_of_workshop.get(change["workshop"], set())
            move = change["kind"] == "move"
            where = Counter()
            stale_latest = None
            for key in keys:
                if move:
                    moved[key] = (until, change["old_deadline"].timestamp())
                for arrived, content in calls.get(key, []):
                    fresh = (
                        move
                        and change["sendable"]
                        and self.carries(content, change["new_start"], change["zone"])
                    )
                    if fresh:
                        where["new time"] += 1
                        continue
                    stale_latest = arrived if stale_latest is None else max(stale_latest, arrived)
                    if arrived <= committed:
                        where["before commit"] += 1
                    elif arrived <= until:
                        where["within bound"] += 1
                    else:
                        where["AFTER BOUND"] += 1
                        counts["late_after_change"] += 1
                        if where["AFTER BOUND"] <= NOTES_PER_KIND:
                            self.notes.append(
                                f"call {arrived - committed:+.3f} s after '{change['label']}' "
                                f"committed: key {key}, content {content!r}"
                            )
                for arrived, content in arrivals.get(key, []):
                    if arrived <= until:
                        continue
                    if change["kind"] == "cancel":
                        counts["sent_after_cancel"] += 1
                    elif self.carries(content, change["old_start"], change["zone"]):
                        counts["old_time_after_move"] += 1
            if not change.get("phase"):
                continue
            counts["staff_changes"] += 1
            counts["staff_in_flight"] += change.get("sending", 0)
            finals = Counter(status_of[key] for key in keys)
            latest = (
                f"latest revoked call {stale_latest - committed:+.3f} s"
                if stale_latest is not None
                else "no revoked call"
            )
            lines.append(
                f"t+{change['at']:6.1f}  {change['label']}\n"
                + f"{'':16}calls: "
                + (", ".join(f"{n} {k}" for k, n in sorted(where.items())) or "none")
                + f"; {latest}; now "
                + ", ".join(f"{n} {s}" for s, n in sorted(finals.items()))
            )
        return lines, moved


if __name__ == "__main__":
    run_program(main)
