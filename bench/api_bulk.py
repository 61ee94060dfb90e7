"""Benchmark the API's bulk enrolment against one-at-a-time requests, over HTTP (not a test).

    .venv/bin/python -m bench.api_bulk                  # 10 x 1,000 bulk vs 1,000 single
    .venv/bin/python -m bench.api_bulk --save           # and write bench/results/api-bulk-COMMIT.json

Starts the production web server (gunicorn, config/gunicorn.py) on a free port
against its own database (``reminders_bench`` unless BENCH_DATABASE_URL says
otherwise), makes a token, and in the same run:

- bulk: ``--requests`` POSTs of ``--items`` enrolments each to /api/enrolments/bulk,
  new attendees each, into workshops inside the lead window, one after another;
- single: ``--singles`` POSTs of one enrolment each to /api/enrolments.

Rounds alternate (bulk, single, bulk, ...) and each reports seconds per enrolment;
the ratio single/bulk is of their medians. Then the reminders of the bulk
workshops are counted (planned with the enrolments) and counted again after one scan.
Target: the 10,000 bulk enrolments in under 10 s, every one with its reminder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import timedelta

BENCH_DB = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/reminders_bench"
)
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-0a1b2c3d4e5f6a7b8c9d0e1f2a")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
os.environ["REMINDERS_API_RATE"] = "100000/minute"

from bench.harness import CLOCK, run_program  # noqa: E402  (after the environment it reads)

TARGET_SECONDS = 10.0


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _serve(port: int, logs):
    from bench.harness import PYTHON, Proc, wait_until

    env = {
        **os.environ,
        "WEB_BIND": f"127.0.0.1:{port}",
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
    }
    server = Proc(
        [PYTHON, "-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi"],
        env,
        "web",
        logs,
    )
    wait_until(lambda: _listening(port), timeout=30, what=f"the web server on port {port}")
    return server


def _round_bulk(client, workshops, *, requests: int, items: int, tag: str) -> float:
    started = CLOCK.monotonic()
    for number in range(requests):
        workshop = workshops[number % len(workshops)]
        body = {
            "items": [
                {
                    "workshop": workshop,
                    "attendee": {
                        "email": f"{tag}.{number}.{i}@example.com",
                        "name": f"Bulk {number}.{i}",
                        "external_id": f"{tag}-{number}-{i}",
                    },
                }
                for i in range(items)
            ]
        }
        response = client.post("/api/enrolments/bulk", json=body)
        if response.status_code != 200 or response.json()["created"] != items:
            raise SystemExit(
                f"bulk request {number} failed: {response.status_code} {response.text[:500]}"
            )
    return CLOCK.monotonic() - started


def _round_single(client, workshop: int, *, count: int, tag: str) -> float:
    started = CLOCK.monotonic()
    for i in range(count):
        response = client.post(
            "/api/enrolments",
            json={
                "workshop": workshop,
                "attendee": {
                    "email": f"{tag}.{i}@example.com",
                    "name": f"Single {i}",
                    "external_id": f"{tag}-{i}",
                },
            },
        )
        if response.status_code != 201:
            raise SystemExit(
                f"single request {i} failed: {response.status_code} {response.text[:500]}"
            )
    return CLOCK.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.api_bulk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)

    from bench.harness import free_port, make_workdir, save_results, saveable
    from bench.scan import _ensure_database

    started_stamp = saveable("api-bulk") if args.save else None
    _ensure_database()
    import django

    django.setup()
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.core.management import call_command

    from intake.models import ApiToken, ApiWrite, AttendeeRef, Integration, WorkshopRef
    from intake.tokens import token_create
    from reminders.models import Reminder, ScanRun
    from reminders.worker.pipeline import scan
    from workshops.models import Attendee, Enrollment, Workshop

    call_command("migrate", verbosity=0)

    def empty() -> None:
        for model in (
            ApiWrite,
            ApiToken,
            AttendeeRef,
            WorkshopRef,
            Reminder,
            Enrollment,
            Attendee,
            Workshop,
        ):
            model.objects.all().delete()
        Integration.objects.all().delete()

    empty()
    ScanRun.objects.all().delete()
    secret = token_create(
        integration="bench", name="bench", scopes=["read", "enrolments"], created_by="bench"
    ).secret
    now = CLOCK.now()

    def workshops(count: int) -> list[int]:
        made = Workshop.objects.bulk_create(
            Workshop(
                title=f"Bench {i}",
                starts_at=now + timedelta(hours=5),
                ends_at=now + timedelta(hours=6),
                timezone="UTC",
            )
            for i in range(count)
        )
        return [w.pk for w in made]

    port = free_port()
    logs = make_workdir("api-bulk")
    server = _serve(port, logs)
    bulk_seconds, single_seconds = [], []
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {secret}", "Host": "127.0.0.1"},
            timeout=120,
        ) as client:
            _round_single(client, workshops(1)[0], count=20, tag="warm")
            for number in range(args.rounds):
                bulk_ids = workshops(args.requests)
                bulk_seconds.append(
                    _round_bulk(
                        client, bulk_ids, requests=args.requests, items=args.items, tag=f"b{number}"
                    )
                )
                planned = Reminder.objects.filter(workshop__in=bulk_ids).count()
                scan(publish=lambda ids: True, notices_publish=lambda ids: True)
                after_scan = Reminder.objects.filter(workshop__in=bulk_ids).count()
                single_seconds.append(
                    _round_single(client, workshops(1)[0], count=args.singles, tag=f"s{number}")
                )
                print(
                    f"round {number + 1}/{args.rounds}: bulk {bulk_seconds[-1]:.2f} s for "
                    f"{args.requests * args.items}, single {single_seconds[-1]:.2f} s for "
                    f"{args.singles}; reminders planned {planned}, after a scan {after_scan}",
                    file=sys.stderr,
                )
    finally:
        server.stop()
        empty()

    total = args.requests * args.items
    bulk = statistics.median(bulk_seconds)
    per_bulk = bulk / total
    per_single = statistics.median(single_seconds) / args.singles
    ratio = per_single / per_bulk
    met = bulk < TARGET_SECONDS and planned == total and after_scan == total
    print(f"bulk enrolment over HTTP (gunicorn, PostgreSQL), median of {args.rounds} rounds")
    print(
        f"  {args.requests} requests of {args.items}:   {bulk:7.2f} s   ({per_bulk * 1e3:.3f} ms each)"
    )
    print(
        f"  {args.singles} single requests: {statistics.median(single_seconds):7.2f} s   ({per_single * 1e3:.3f} ms each)"
    )
    print(f"  single / bulk per enrolment:  {ratio:7.1f}x")
    print(
        f"  reminders planned with the last bulk round: {planned} of {total}; after a scan: {after_scan}"
    )
    print(
        f"target: {total} in under {TARGET_SECONDS:.0f} s, each with its reminder: {'met' if met else 'MISSED'}"
    )
    if args.save:
        figures = {
            "bench": "api-bulk",
            **started_stamp,
            "settings": {
                "requests": args.requests,
                "items": args.items,
                "singles": args.singles,
                "rounds": args.rounds,
                "command": "python -m bench.api_bulk --save",
            },
            "bulk_seconds": round(bulk, 2),
            "bulk_ms_per_enrolment": round(per_bulk * 1e3, 3),
            "single_ms_per_enrolment": round(per_single * 1e3, 3),
            "ratio": round(ratio, 1),
            "planned": planned,
            "after_scan": after_scan,
        }
        print(f"saved {save_results('api-bulk', figures)}")
    return 0 if met else 1


if __name__ == "__main__":
    run_program(main)
