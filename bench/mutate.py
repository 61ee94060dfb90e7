"""Mutation testing of the modules that hold the promise (``make mutate``; not in CI).

Runs mutmut once per module, each time with only the tests that cover that module,
then prints a table of killed / survived / timeout / other per module and lists the
surviving mutants. The mutmut settings shared by every run (what to copy, which files
may be mutated) live in ``[tool.mutmut]`` in pyproject.toml; this script swaps in the
module's test selection and mutant-name globs.

    python -m bench.mutate                  # every module
    python -m bench.mutate gate policy      # just these
    python -m bench.mutate --list           # the module map

Inspect a survivor with ``.venv/bin/mutmut show <mutant name>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
REMINDER_TESTS = "tests/reminders"
DELIVERY_TESTS = "tests/delivery"
NOTICE_TESTS = "tests/notices"

# Tests that take seconds because they race threads for real; they prove the SQL
# guards hold under contention, which a mutant of the guard breaks on the serial
# tests already. Left out of the mutation runs to keep ``make mutate`` short.
SLOW_RACES = [
    f"--deselect={REMINDER_TESTS}/test_claim.py::"
    "test_eight_threads_racing_for_the_same_thousand_reminders_claim_each_once",
    f"--deselect={REMINDER_TESTS}/test_fate.py::"
    "test_record_and_reaper_racing_on_the_same_rows_agree_and_never_deadlock",
]


@dataclass(frozen=True)
class Module:
    key: str
    path: str
    tests: tuple[str, ...]
    # mutmut mutant-name globs; the default is every function in the file.
    only: tuple[str, ...] = ()

    @property
    def dotted(self) -> str:
        return self.path.removesuffix(".py").replace("/", ".")

    @property
    def globs(self) -> list[str]:
        if not self.only:
            return [f"{self.dotted}.*"]
        return [f"{self.dotted}.{name}__mutmut_*" for name in self.only]


def _r(*names: str) -> tuple[str, ...]:
    return tuple(f"{REMINDER_TESTS}/{name}" for name in names)


def _d(*names: str) -> tuple[str, ...]:
    return tuple(f"{DELIVERY_TESTS}/{name}" for name in names)


def _engine(name: str) -> str:
    return f"xǁ_Batchǁ{name}"


MODULES = [
    Module(
        "claim",
        "reminders/services/claim.py",
        _r("test_claim.py", "test_guards.py", "test_pipeline.py", "test_mutants.py"),
    ),
    Module(
        "record",
        "reminders/services/record.py",
        _r("test_claim.py", "test_guards.py", "test_fate.py", "test_mutants.py")
        + ("tests/admin/test_erasure.py",),
    ),
    Module(
        "reap",
        "reminders/services/reap.py",
        _r("test_claim.py", "test_fate.py", "test_mutants.py"),
    ),
    Module(
        "dispatch",
        "reminders/services/dispatch.py",
        _r("test_dispatch.py", "test_pipeline.py", "test_mutants.py"),
        # The dispatch and its message expiry; not scan_completed (the scan's health record).
        only=(
            "x_message_expiry",
            "x_reminders_dispatch",
            "x_reminders_unpublished",
        ),
    ),
    Module(
        "fate",
        "reminders/services/fate.py",
        _r("test_fate.py", "test_claim.py", "test_guards.py", "test_mutants.py"),
    ),
    Module(
        "policy",
        "reminders/policy.py",
        _r("test_policy.py", "test_fate.py", "test_mutants.py"),
    ),
    Module(
        "engine",
        "delivery/engine.py",
        _d("test_engine.py", "test_drain.py", "test_gate.py", "test_policy.py", "test_mutants.py"),
        # the per-call deadline, its clamp, and the drain; not the loop plumbing.
        only=tuple(
            _engine(name)
            for name in (
                "_watch",
                "_drain",
                "_deliver_one",
                "_try_once",
                "_seconds_left",
                "_finish_at_deadline",
                "_finish_cancelled",
            )
        ),
    ),
    Module(
        "limiter",
        "delivery/limiter.py",
        _d("test_limiter.py", "test_mutants.py"),
    ),
    Module(
        "gate",
        "delivery/gate.py",
        _d("test_gate.py", "test_mutants.py"),
    ),
    Module(
        "watch",
        "reminders/services/watch.py",
        _r("test_bridge.py", "test_claim.py", "test_claim_sql.py", "test_record_sqlite.py")
        + _r("test_pipeline.py", "test_mutants.py"),
    ),
    Module(
        "settle",
        "reminders/services/settle.py",
        _r("test_fate.py", "test_dispatch.py", "test_pipeline.py", "test_plan.py")
        + _r("test_mutants.py")
        + ("tests/admin/test_workshop_decisions.py", "tests/integration/test_one_truth.py"),
    ),
    Module(
        "plan",
        "reminders/services/plan.py",
        _r("test_plan.py", "test_dispatch.py", "test_fate.py", "test_mutants.py")
        + ("tests/integration/test_one_truth.py",),
    ),
    Module(
        "hedge",
        "delivery/hedge.py",
        _d("test_hedge.py", "test_channel_http.py", "test_gate.py", "test_mutants.py"),
    ),
    Module(
        "session",
        "delivery/session.py",
        _d("test_session.py", "test_sync.py", "test_mutants.py") + _r("test_kept_session.py"),
    ),
    Module(
        "pipeline",
        "reminders/worker/pipeline.py",
        _r("test_pipeline.py", "test_bridge.py", "test_dispatch.py", "test_mutants.py")
        + tuple(
            f"tests/integration/test_{name}.py"
            for name in ("soft_limit", "faults", "lock_timeouts", "skewed_clock", "suppression")
        )
        + ("tests/notices/test_notice_flow.py",),
    ),
    Module(
        "notices",
        "reminders/services/notices.py",
        # Not test_notices_sqlite.py (long: a SQLite run in a process of its own). Of the
        # attendee links' tests, those of a notice (the others read docs/, not in mutants/).
        (f"{NOTICE_TESTS}/test_notice_flow.py", f"{NOTICE_TESTS}/test_notice_outcomes.py")
        + ("tests/admin/test_notice_staff.py",)
        + tuple(
            f"tests/attendance/test_attendance_links.py::{name}"
            for name in (
                "test_one_click_unsubscribe_stops_notices_and_keeps_the_seat",
                "test_a_change_notice_carries_the_same_links",
                "test_a_notice_in_flight_when_its_attendee_unsubscribes_is_not_sent_on_its_retry",
            )
        ),
        # What sends a notice once and never late: plan, settle, dispatch, claim (with its
        # guards) and record. Not the revise, the compare or the staff counts: every one of
        # the file's 1,206 mutants runs most of these tests, hours on 2 cores.
        only=(
            "x__plan",
            "x_notices_plan",
            "x_notices_settle",
            "x_notices_dispatch",
            "x__publish",
            "x__live_now",
            "x__lacking",
            "x_notice_claim",
            "x_notice_record",
            "x__verdict",
            "x__final",
            "x__mark_told",
        ),
    ),
]
BY_KEY = {module.key: module for module in MODULES}

# mutmut's exit codes per mutant, folded into the columns of the table.
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152, 255}
NO_TESTS = {5, 33}


def _existing(tests: tuple[str, ...]) -> list[str]:
    """The selection's test files (or ``file::test`` ids) whose file exists."""
    return [test for test in tests if (ROOT / test.partition("::")[0]).exists()]


def _mutmut_run(module: Module, max_children: int) -> None:
    """Run mutmut in this process with the module's own test selection."""
    from mutmut import configuration

    cfg = configuration.config()
    configuration._config = dataclasses.replace(
        cfg,
        pytest_add_cli_args=[*cfg.pytest_add_cli_args, *SLOW_RACES],
        pytest_add_cli_args_test_selection=_existing(module.tests),
    )
    from mutmut.__main__ import cli

    cli(["run", "--max-children", str(max_children), *module.globs])


def _results(module: Module) -> dict[str, int | None]:
    meta = MUTANTS / f"{module.path}.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {
        name: code
        for name, code in codes.items()
        if any(fnmatch.fnmatch(name, glob) for glob in module.globs)
    }


def _run_one(module: Module, max_children: int) -> dict:
    # A fresh stats run per module: mutmut maps each function to the tests that
    # call it, within this module's selection only.
    for stale in ("mutmut-stats.json",):
        (MUTANTS / stale).unlink(missing_ok=True)
    # A module new to only_mutate was copied unmutated, and mutmut keeps a copy no older than
    # its source: without the copy, mutmut mutates it afresh.
    if not (MUTANTS / f"{module.path}.meta").exists():
        (MUTANTS / module.path).unlink(missing_ok=True)
    started = time.monotonic()  # noqa: TID251 - a benchmark's own wall time
    done = subprocess.run(
        [sys.executable, "-m", "bench.mutate", "--child", module.key, "-j", str(max_children)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seconds = time.monotonic() - started  # noqa: TID251
    log = MUTANTS / f"{module.key}.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text(done.stdout)
    if done.returncode != 0:
        print(done.stdout[-4000:])
        raise SystemExit(f"mutmut failed on {module.path} (exit {done.returncode}); see {log}")
    codes = _results(module)
    row = {
        "module": module.key,
        "path": module.path,
        "total": len(codes),
        "killed": sum(code in KILLED for code in codes.values()),
        "survived": sorted(name for name, code in codes.items() if code in SURVIVED),
        "timeout": sum(code in TIMEOUT for code in codes.values()),
        "no_tests": sorted(name for name, code in codes.items() if code in NO_TESTS),
        "other": sorted(
            f"{name} (exit {code})"
            for name, code in codes.items()
            if code not in KILLED | SURVIVED | TIMEOUT | NO_TESTS
        ),
        "seconds": seconds,
    }
    return row


def _score(row: dict) -> float:
    tested = row["total"] - len(row["no_tests"])
    caught = row["killed"] + row["timeout"]
    return 100.0 * caught / tested if tested else 0.0


def _print_table(rows: list[dict]) -> None:
    head = f"{'module':<34} {'mutants':>7} {'killed':>6} {'timeout':>7} {'survived':>8} "
    head += f"{'no tests':>8} {'other':>5} {'score':>6} {'time':>6}"
    print(head)
    print("-" * len(head))
    for row in rows:
        print(
            f"{row['path']:<34} {row['total']:>7} {row['killed']:>6} {row['timeout']:>7} "
            f"{len(row['survived']):>8} {len(row['no_tests']):>8} {len(row['other']):>5} "
            f"{_score(row):>5.1f}% {row['seconds']:>5.0f}s"
        )
    print()
    print("score = (killed + timeout) / (mutants - no tests)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"subset of: {', '.join(BY_KEY)}")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--list", action="store_true", help="print the module map and exit")
    parser.add_argument("--fresh", action="store_true", help="delete mutants/ first")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    os.chdir(ROOT)
    if args.child:
        _mutmut_run(BY_KEY[args.child], args.jobs)
        return 0
    if args.list:
        for module in MODULES:
            print(f"{module.path}: {' '.join(_existing(module.tests))}")
            for glob in module.globs:
                print(f"    {glob}")
        return 0
    unknown = [key for key in args.modules if key not in BY_KEY]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; choose from {list(BY_KEY)}")
    missing = [
        name
        for name in ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY")
        if not os.environ.get(name)
    ]
    if missing:
        parser.error(f"set {', '.join(missing)} (make mutate does)")
    if args.fresh and MUTANTS.exists():
        shutil.rmtree(MUTANTS)

    started = time.monotonic()  # noqa: TID251
    rows = []
    for module in [BY_KEY[key] for key in args.modules] or MODULES:
        print(f"== {module.path}", flush=True)
        row = _run_one(module, args.jobs)
        print(
            f"   {row['killed'] + row['timeout']}/{row['total'] - len(row['no_tests'])} caught, "
            f"{len(row['survived'])} survived, {row['seconds']:.0f}s",
            flush=True,
        )
        rows.append(row)
    print()
    _print_table(rows)
    print(f"total wall time {time.monotonic() - started:.0f}s")  # noqa: TID251
    for row in rows:
        for title, names in (
            ("survived", row["survived"]),
            ("no tests", row["no_tests"]),
            ("other", row["other"]),
        ):
            if names:
                print(f"\n{row['path']} {title}:")
                for name in names:
                    print(f"  {name}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
