"""Benchmark the delivery engine against a loopback HTTP provider (not a test).

    .venv/bin/python -m bench.delivery                # full size
    .venv/bin/python -m bench.delivery --count 200 --rate-count 60 --baseline-count 10

Runs, against ``loopback.http_sink`` in its own process (answering after
``--delay`` seconds):

1. baseline: sends one at a time with a blocking client, as one Celery task
   per reminder would;
2. fan-out: ``--count`` envelopes through a ``Session`` and the http
   channel with ``--concurrency`` calls in flight; the bound is
   concurrency / delay;
3. rate-limited: ``--rate-count`` envelopes at ``--rate`` starts per second
   through the RedisRateLimiter and the LocalRateLimiter; the server reports
   the most requests it saw in any one-second window.

One untimed single-envelope batch runs first, so one-time import costs of
the worker process are not billed to the fan-out. Opening the batch's
connections is billed (every Celery batch pays it): below about 1,000 sends
that ramp-up, not the steady state, dominates the fraction of the bound.

The achieved rate of a rate-limited run is the steady rate the server saw,
(requests - 1) / (last arrival - first arrival). The limiters spread starts
evenly, so this is the rate a provider measures over any long stretch; the
whole batch's wall-clock rate is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import httpx

from clock import SystemClock
from delivery import DeliveryLimits, Envelope, Outcome, Session
from delivery.channels import HttpChannel, HttpSettings
from delivery.channels.http import encode_body, signed_headers
from delivery.limiter import DEFAULT_MARGIN, LocalRateLimiter, RedisRateLimiter
from loopback.windows import max_in_window

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-secret-0a1b2c3d4e5f6a7b8c9d0e1f"
TARGET_FRACTION_OF_BOUND = 0.8
TARGET_SPEEDUP = 20.0
TARGET_FRACTION_OF_RATE = 0.95


class Sink:
    """``loopback.http_sink`` in a child process, so it does not share our GIL."""

    def __init__(self, delay: float) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loopback.http_sink",
                "--port",
                "0",
                "--secret",
                SECRET,
                "--delay",
                str(delay),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line = self.process.stdout.readline().strip()
        if "listening on" not in line:
            self.process.kill()
            raise SystemExit(f"http_sink did not start: {line!r}")
        self.base_url = line.rsplit(" ", 1)[1]
        self.url = f"{self.base_url}/reminders"
        self.control = httpx.Client(base_url=self.base_url, timeout=10)

    def reset(self) -> None:
        self.control.post("/_reset").raise_for_status()

    def stats(self) -> dict:
        return self.control.get("/_stats").json()

    def arrivals(self) -> list[float]:
        return self.control.get("/_arrivals").json()["arrivals"]

    def close(self) -> None:
        self.control.close()
        self.process.terminate()
        self.process.wait(10)


def envelopes(count: int, clock: SystemClock, prefix: str) -> list[Envelope]:
    deadline = clock.now() + timedelta(hours=1)
    return [
        Envelope(
            reminder_id=number,
            key=f"{prefix}-{number}",
            recipient=f"person{number}@example.com",
            recipient_name=f"Person {number}",
            subject="Reminder: Intro to pottery starts in one hour",
            text_body="See you at 10:00 in room 2.",
            deadline_at=deadline,
            payload={"workshop_title": "Intro to pottery", "starts_at": "2026-03-02T10:00:00Z"},
        )
        for number in range(1, count + 1)
    ]


def run_baseline(sink: Sink, count: int, clock: SystemClock) -> float:
    """Send ``count`` reminders one after another with a blocking client; return sends/s."""
    batch = envelopes(count, clock, f"baseline-{uuid.uuid4().hex[:8]}")
    began = clock.monotonic()
    with httpx.Client(timeout=10) as client:
        for envelope in batch:
            body = encode_body(envelope)
            timestamp = str(int(clock.now().timestamp()))
            response = client.post(
                sink.url,
                content=body,
                headers=signed_headers(
                    secret=SECRET, key=envelope.key, body=body, timestamp=timestamp
                ),
            )
            response.raise_for_status()
    return count / (clock.monotonic() - began)


def run_fan_out(
    sink: Sink, count: int, concurrency: int, clock: SystemClock, limiter_factory=None
) -> tuple[float, int]:
    """Deliver ``count`` envelopes; return (sends/s over the batch, how many were sent)."""
    batch = envelopes(count, clock, f"fanout-{uuid.uuid4().hex[:8]}")
    settings = HttpSettings(url=sink.url, secret=SECRET)
    policy = DeliveryLimits(concurrency=concurrency, call_timeout=10, max_attempts=3, budget=600)
    began = clock.monotonic()
    with Session(
        lambda: HttpChannel(settings, clock=clock), clock=clock, limiter_factory=limiter_factory
    ) as session:
        results = session.deliver(batch, policy=policy)
    elapsed = clock.monotonic() - began
    sent = sum(result.outcome is Outcome.SENT for result in results)
    return count / elapsed, sent


def rate_run(
    name: str, sink: Sink, args: argparse.Namespace, clock: SystemClock, limiter_factory
) -> bool:
    sink.reset()
    batch_rate, sent = run_fan_out(sink, args.rate_count, args.concurrency, clock, limiter_factory)
    arrivals = sink.arrivals()
    busiest = max_in_window(arrivals)
    achieved = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    ok = achieved >= TARGET_FRACTION_OF_RATE * args.rate and busiest <= args.rate
    print(
        f"{name:<14} R={args.rate}/s  sent {sent}/{args.rate_count}  "
        f"achieved {achieved:6.1f}/s = {achieved / args.rate:.3f} R  "
        f"(batch wall clock {batch_rate:.1f}/s)  busiest 1 s window at server: {busiest}"
        f"  [{'ok' if ok else 'MISSED'}: >= {TARGET_FRACTION_OF_RATE} R, <= R per window]"
    )
    return ok


def redis_reachable(url: str) -> bool:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.delivery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.1, help="provider answer time (s)")
    parser.add_argument("--baseline-count", type=int, default=50)
    parser.add_argument("--rate", type=int, default=50, help="R: call starts per second")
    parser.add_argument("--rate-count", type=int, default=500)
    parser.add_argument(
        "--redis-url", default=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    clock = SystemClock()

    sink = Sink(args.delay)
    verdicts = []
    try:
        print(
            f"loopback http_sink (own process), answer delay {args.delay * 1000:.0f} ms, "
            f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
        )
        baseline = run_baseline(sink, args.baseline_count, clock)
        print(
            f"baseline       one at a time, blocking client: {args.baseline_count} sends "
            f"at {baseline:.1f}/s"
        )

        run_fan_out(sink, 1, args.concurrency, clock)  # warm-up: imports, lazy set-up
        sink.reset()
        rate, sent = run_fan_out(sink, args.count, args.concurrency, clock)
        bound = args.concurrency / args.delay
        stats = sink.stats()
        fraction_ok = rate / bound >= TARGET_FRACTION_OF_BOUND and sent == args.count
        speedup_ok = rate / baseline >= TARGET_SPEEDUP
        verdicts += [fraction_ok, speedup_ok]
        print(
            f"fan-out        C={args.concurrency}, {args.count} sends: {rate:.1f}/s = "
            f"{rate / bound:.3f} of the bound C/L={bound:.0f}/s  "
            f"[{'ok' if fraction_ok else 'MISSED'}: >= {TARGET_FRACTION_OF_BOUND}]"
        )
        print(
            f"               {rate / baseline:.1f}x the blocking baseline  "
            f"[{'ok' if speedup_ok else 'MISSED'}: >= {TARGET_SPEEDUP:.0f}x]; "
            f"server: {stats['accepted']} accepted, {stats['duplicates']} duplicates, "
            f"peak {stats['peak_in_flight']} in flight"
        )

        if redis_reachable(args.redis_url):
            account = f"bench-{uuid.uuid4().hex[:8]}"

            def redis_limiter():
                return RedisRateLimiter(
                    url=args.redis_url, account=account, per_second=args.rate, clock=clock
                )

            verdicts.append(rate_run("redis limiter", sink, args, clock, redis_limiter))
            cleanup = RedisRateLimiter(
                url=args.redis_url, account=account, per_second=1, clock=clock
            )
            import redis

            with redis.Redis.from_url(args.redis_url) as client:
                client.delete(cleanup.starts_key, cleanup.pause_key, cleanup.due_key)
        else:
            print(f"redis limiter  skipped: no Redis at {args.redis_url}")
            verdicts.append(False)
        verdicts.append(
            rate_run(
                "local limiter",
                sink,
                args,
                clock,
                lambda: LocalRateLimiter(args.rate, clock=clock),
            )
        )
        print(f"limiter margin {DEFAULT_MARGIN * 1000:.0f} ms per window (network jitter guard)")
    finally:
        sink.close()

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS       {peak_rss_mb:.1f} MB (this process; the sink runs apart)")
    print(json.dumps({"targets_met": all(verdicts)}))
    return 1 if args.check and not all(verdicts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
