"""The loopback sinks as processes for the chaos run and the e2e benchmark.

    python -m bench.sinks smtp --jsonl FILE [--port P]
    python -m bench.sinks http --jsonl FILE [--port P] [--secret S] [--delay D] [--rate-limit N]

Both are the real servers of ``loopback`` (aiosmtpd and the asyncio HTTP
sink), with two additions a fault-injection driver needs from a separate
process:

- every request is appended to ``--jsonl`` with its arrival time (monotonic
  seconds: CLOCK_MONOTONIC is one clock for every process on the host, so a
  driver can compare it with its own). SMTP lines are the sink's own
  ``ReceivedMessage.as_json`` (accepted messages only); HTTP lines carry
  ``arrived_at``, ``key``, ``status``, ``duplicate``, ``email``, ``title``
  and ``starts_at`` (the payload's, so a driver can tell which start time a
  message carried) for every request, whatever the answer.
- control over stdin, one JSON object per line, answered by one line
  ``ok <settings>`` on stdout. SMTP: ``data_delay``, ``reply_delay``,
  ``fail_reply`` (answer every DATA with this reply until cleared with
  null: a provider outage lasts a period, not a number of messages) and
  ``reply_to_data`` (a list of replies for the next DATA commands). HTTP: any
  ``loopback.http_sink.SinkSettings`` field (``delay``, ``fail_status``,
  ``fail_next``, ``retry_after``, ``rate_limit``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from loopback.http_sink import HttpSink
from loopback.smtp_sink import SmtpSink


class ChaosSmtpSink(SmtpSink):
    """An SmtpSink that can refuse every message for a period (``fail_reply``)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_reply: str | None = None
        self.refused = 0

    async def handle_DATA(self, server, session, envelope) -> str:
        reply = self.fail_reply
        if reply:
            self.refused += 1
            return reply
        return await super().handle_DATA(server, session, envelope)

    def apply(self, changes: dict) -> dict:
        for name, value in changes.items():
            if name == "reply_to_data":
                self.reply_to_data(*value)
            elif name in ("data_delay", "reply_delay"):
                setattr(self, name, float(value))
            elif name == "fail_reply":
                self.fail_reply = value or None
            else:
                raise ValueError(f"unknown smtp sink setting {name!r}")
        return {
            "data_delay": self.data_delay,
            "reply_delay": self.reply_delay,
            "fail_reply": self.fail_reply,
            "refused": self.refused,
            "received": len(self.messages),
        }


class RecordingHttpSink(HttpSink):
    """An HttpSink that appends every request (and its answer) to a JSONL file."""

    def __init__(self, *, jsonl: Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self._jsonl = jsonl.open("a", encoding="utf-8")

    def _decide(self, parsed, path):
        decided = super()._decide(parsed, path)
        # Only the server's event loop appends to self.requests: the last one is ours.
        record = self.requests[-1]
        email = title = starts_at = None
        try:
            body = json.loads(record.body)
            email = body["recipient"]["email"]
            title = body["payload"].get("workshop_title")
            starts_at = body["payload"].get("starts_at")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        line = {
            "arrived_at": record.arrived_at,
            "key": record.key,
            "status": record.status,
            "duplicate": record.duplicate,
            "email": email,
            "title": title,
            "starts_at": starts_at,
        }
        self._jsonl.write(json.dumps(line) + "\n")
        self._jsonl.flush()
        return decided

    def apply(self, changes: dict) -> dict:
        return asdict(self.configure(**changes))


def _control_loop(sink, loop: asyncio.AbstractEventLoop) -> None:
    """Apply each JSON line of stdin on the server's loop and acknowledge it on stdout."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            changes = json.loads(line)
            future = asyncio.run_coroutine_threadsafe(_apply(sink, changes), loop)
            answer = "ok " + json.dumps(future.result(10))
        except Exception as exc:  # report the refusal, keep serving
            answer = f"error {exc!r}"
        print(answer, flush=True)


async def _apply(sink, changes: dict) -> dict:
    return sink.apply(changes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sinks", description=__doc__)
    parser.add_argument("kind", choices=["smtp", "http"])
    parser.add_argument("--jsonl", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret", default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--rate-limit", type=int, default=None)
    args = parser.parse_args(argv)
    if args.kind == "smtp":
        sink = ChaosSmtpSink(port=args.port, jsonl=args.jsonl)
    else:
        sink = RecordingHttpSink(
            port=args.port,
            jsonl=Path(args.jsonl),
            secret=args.secret,
            delay=args.delay,
            rate_limit=args.rate_limit,
        )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await sink.serve()
        where = sink.base_url if args.kind == "http" else f"{sink.host}:{sink.port}"
        print(f"{args.kind} sink listening on {where}", flush=True)
        threading.Thread(target=_control_loop, args=(sink, loop), daemon=True).start()
        await stop.wait()
        await sink.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
