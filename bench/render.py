"""Rendering cost per reminder, against the renderer of an earlier commit in the same run (not a test).

    .venv/bin/python -m bench.render                       # against bc007ec, 7 rounds of 4,000
    .venv/bin/python -m bench.render --against HEAD~3 --rounds 3 --reminders 1000

Each round starts one fresh process per case and takes its CPU time
(``time.process_time``) over ``--reminders`` calls of
``reminders.content.reminder_envelope`` on reminders held in memory, after
one untimed pass: no database, no I/O, only the rendering (subject, text and
HTML parts, the .ics). A claimed reminder carries its frozen text, as the
claim loads it, so the rendered text is not chosen again.

The baseline runs the same code in a git worktree of ``--against`` (default
bc007ec, the last commit before staff texts and languages), with the
built-in English text, the attendee in the workshop's zone, and a location,
join link and organiser. Rounds alternate baseline and current, so a drift
of the machine's speed touches both. The current tree also renders:

- the same message (the like-for-like figure the target is about);
- German, with the attendee in another zone (the "which is ... where it is
  held" line);
- French with a staff-written subject and intro using every placeholder.

Printed: each case's median CPU per reminder, and its ratio to the
baseline's. The target: the like-for-like case within 1.10x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, save_results, saveable

TARGET_RATIO = 1.10

# Runs in a fresh interpreter, in the tree it is given; uses only what both trees have.
CHILD = r"""
import os, sys, time
sys.path.insert(0, os.getcwd())
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
os.environ.setdefault("SECRET_KEY", "bench-render-0a1b2c3d4e5f6a7b8c9d0e1f")
import django
django.setup()
from datetime import UTC, datetime, timedelta
from reminders import content
from reminders.models import Reminder
from workshops.models import Attendee, Workshop

case, count = sys.argv[1], int(sys.argv[2])
start = datetime(2026, 3, 29, 8, 0, tzinfo=UTC)
every = " ".join("{%s}" % name for name in (
    "attendee_name", "workshop_title", "start_local", "end_local", "zone", "location",
    "join_url", "organiser", "organiser_email"))
texts = {"staff-fr": {"language": "fr", "reminder_subject": "Rappel {workshop_title} {start_local}",
                      "reminder_intro": "Bonjour {attendee_name},\n\n" + every}}
workshop = Workshop(
    pk=None, title="Glaze lab", starts_at=start, ends_at=start + timedelta(hours=2),
    timezone="Europe/Berlin", location="Room 2, Kiln House",
    join_url="https://meet.example.org/kiln", contact_name="Ada Lovelace",
    contact_email="ada@example.org", **texts.get(case, {}))
# Commits before 0017 stored a copy of the deadline on the row.
stored = ({"deadline_at": start - timedelta(minutes=30)}
          if any(f.name == "deadline_at" for f in Reminder._meta.fields) else {})
rows = []
for i in range(count):
    person = {"name": f"Attendee {i}", "email": f"a{i}@example.org"}
    if case == "built-in-de-elsewhere":
        person.update(language="de", timezone="America/New_York")
    attendee = Attendee(pk=i + 1, **person)
    reminder = Reminder(pk=i + 1, key=f"bench-w1-a{i + 1}", created_at=start, **stored)
    reminder.workshop, reminder.attendee = workshop, attendee
    if hasattr(content, "choose_text"):  # the text the claim froze (pk first: text_id is set)
        text = content.choose_text(workshop=workshop, attendee=attendee, texts={})
        text.pk = 1
        reminder.text = text
    rows.append(reminder)
for reminder in rows:
    content.reminder_envelope(reminder=reminder)
began = time.process_time()
for reminder in rows:
    content.reminder_envelope(reminder=reminder)
print((time.process_time() - began) / count * 1e6)
"""

CASES = ("built-in-en", "built-in-de-elsewhere", "staff-fr")
LABELS = {
    "baseline": "built-in English text ({against})",
    "built-in-en": "built-in English text (this tree)",
    "built-in-de-elsewhere": "built-in German text, attendee in another zone",
    "staff-fr": "staff-written French subject and intro, every placeholder",
}


def _run(tree: Path, case: str, count: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(count)],
        cwd=tree,
        env={
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
            },
            "SECRET_KEY": "bench-render-0a1b2c3d4e5f6a7b8c9d0e1f",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"rendering {case!r} in {tree} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.render",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--against", default="bc007ec", help="the commit of the baseline")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reminders", type=int, default=4000)
    parser.add_argument(
        "--save",
        action="store_true",
        help="write the figures to bench/results/render-COMMIT.json (from a clean tree)",
    )
    args = parser.parse_args(argv)
    started = saveable("render") if args.save else None

    with tempfile.TemporaryDirectory(prefix="render-baseline-") as scratch:
        baseline_tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(baseline_tree), args.against],
            cwd=ROOT,
            check=True,
        )
        try:
            samples: dict[str, list[float]] = {"baseline": [], **{case: [] for case in CASES}}
            for number in range(args.rounds):
                samples["baseline"].append(_run(baseline_tree, "built-in-en", args.reminders))
                for case in CASES:
                    samples[case].append(_run(ROOT, case, args.reminders))
                print(f"round {number + 1}/{args.rounds}", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(baseline_tree)], cwd=ROOT, check=False
            )

    medians = {case: statistics.median(values) for case, values in samples.items()}
    base = medians["baseline"]
    print(
        f"rendering one reminder: CPU, median of {args.rounds} rounds of {args.reminders} "
        "(one fresh process per case and round)"
    )
    for case, median in medians.items():
        label = LABELS[case].format(against=args.against)
        spread = f"{min(samples[case]):.1f}-{max(samples[case]):.1f}"
        print(f"  {label:<62} {median:7.1f} us  ({spread})  {median / base:5.2f}x")
    ratio = medians["built-in-en"] / base
    met = ratio <= TARGET_RATIO
    print(
        f"like for like: {ratio:.2f}x of {args.against}'s (target <= {TARGET_RATIO:.2f}x): "
        f"{'met' if met else 'MISSED'}"
    )
    if args.save:
        figures = {
            "bench": "render",
            **started,
            "settings": {
                "against": args.against,
                "rounds": args.rounds,
                "reminders": args.reminders,
                "command": "python -m bench.render --save",
            },
            "against": args.against,
            "rounds": args.rounds,
            "reminders": args.reminders,
            "us_per_reminder": {case: round(median, 1) for case, median in medians.items()},
            "ratio": {case: round(median / base, 3) for case, median in medians.items()},
        }
        print(f"saved {save_results('render', figures)}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
