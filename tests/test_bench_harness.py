"""A benchmark stopped by a signal stops what it started (bench.harness.run_program).

Its servers run in sessions of their own, so only the driver's own unwinding can
reach them: these start a real redis-server through the harness, signal the driver
alone, and look for the server afterwards.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.harness import CLOCK, ROOT

DRIVER = textwrap.dedent(
    """
    import signal
    import sys
    from pathlib import Path

    from bench.harness import CLOCK, PrivateRedis, run_program

    CLEANUP, KILLED = sys.argv[2] == "cleanup", sys.argv[2] == "killed"
    DEAF_TO_HUP = sys.argv[3] == "nohup"


    def main():
        redis = PrivateRedis(Path(sys.argv[1]))
        redis.start()
        try:
            print(redis.process.pid, flush=True)
            if KILLED:  # as a chaos step kills a worker, leaving it listed
                redis.process.kill()
                redis.process.wait()
                print("killed", flush=True)
            CLOCK.sleep_blocking(float(sys.argv[4]))
        finally:
            if CLEANUP:
                redis.close()
        return 0


    # Started as from a terminal, whatever the test runner inherited (a run under nohup,
    # or in the background of a script, ignores SIGHUP or SIGINT, and so would this).
    for each in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(each, signal.SIG_DFL)
    if DEAF_TO_HUP:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    run_program(main)
    """
)


def _alive(pid: int) -> bool:
    """True while the process runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = CLOCK.monotonic() + seconds
    while _alive(pid) and CLOCK.monotonic() < deadline:
        CLOCK.sleep_blocking(0.05)
    return not _alive(pid)


@pytest.fixture
def driver(tmp_path):
    """Start the driver; return (its process, its redis-server's pid, what it said on
    stderr so far); kill both after."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    started = []
    stderr = tmp_path / "driver.err"

    def start(*, cleanup: str, nohup: bool = False, runs_for: float = 60):
        process = subprocess.Popen(
            [
                sys.executable, str(script), str(tmp_path / "redis"),
                cleanup, "nohup" if nohup else "-", str(runs_for),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr.open("w"),
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        server = int(process.stdout.readline())
        started.append((process, server))
        return process, server, stderr.read_text

    yield start
    for process, server in started:
        process.kill()
        process.wait(10)
        if _alive(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signalled_benchmark_stops_the_server_it_started(driver, sig):
    process, server, said = driver(cleanup="cleanup")
    assert _alive(server)
    process.send_signal(sig)
    assert process.wait(30) == 128 + sig
    assert _gone_within(server, 10), "the driver's redis-server outlived it"
    assert "left running" not in said()  # its own cleanup stopped it: nothing left over


@pytest.mark.parametrize("runs_for", [60, 0], ids=["signalled", "returned"])
def test_a_server_no_cleanup_stopped_is_stopped_at_the_end(driver, runs_for):
    process, server, said = driver(cleanup="none", runs_for=runs_for)
    if runs_for:
        assert _alive(server)
        process.send_signal(signal.SIGTERM)
    process.wait(30)
    assert _gone_within(server, 10), "a server left by the run outlived the driver"
    assert "stopped 1 server(s) or worker(s) the run left running" in said()


def test_a_driver_started_deaf_to_sighup_stays_so(driver):
    process, server, _ = driver(cleanup="cleanup", nohup=True)
    process.send_signal(signal.SIGHUP)
    CLOCK.sleep_blocking(0.5)
    assert process.poll() is None and _alive(server), "nohup's SIGHUP stopped the run"
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 128 + signal.SIGTERM
    assert _gone_within(server, 10)


@pytest.mark.parametrize("program", ["chaos", "e2e", "dblayer", "scan_million", "api_bulk"])
def test_each_benchmark_that_starts_servers_runs_through_run_program(program):
    tree = ast.parse(Path(ROOT, "bench", f"{program}.py").read_text())
    guard = tree.body[-1]
    assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "__name__ == '__main__'"
    assert [ast.unparse(line) for line in guard.body] == ["run_program(main)"]


def test_a_server_that_died_during_the_run_is_not_counted_as_left_running(driver):
    process, server, said = driver(cleanup="killed")
    # The signal comes after the driver has reaped it, as after a chaos step's kill.
    assert process.stdout.readline().strip() == "killed"
    assert not _alive(server)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 128 + signal.SIGTERM
    assert "left running" not in said()


def test_the_delivery_benchmark_runs_against_the_library_as_it_is_now(redis_url):
    """The benchmarks drive the delivery library directly, and no other test runs them: an
    option the library lost (7f093bc's ``HttpSettings.max_connections``) broke this one unseen."""
    finished = subprocess.run(
        [sys.executable, "-m", "bench.delivery", "--count", "30", "--rate-count", "6"]
        + ["--baseline-count", "2", "--rate", "20", "--redis-url", redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "fan-out        C=50, 30 sends" in finished.stdout
    assert finished.stdout.count("sent 6/6") == 2, finished.stdout  # the Redis and local limiters


def test_the_mutation_run_names_only_functions_and_tests_that_exist():
    """bench/mutate.py lists modules, their tests and (mutmut's x_ names of) functions by hand."""
    from bench.mutate import MODULES

    root = Path(__file__).resolve().parent.parent
    for module in MODULES:
        source = (root / module.path).read_text()
        for name in module.only:
            # mutmut names a function x_<name>, a method xǁ<class>ǁ<name>.
            *owner, function = name.removeprefix("x_").split("ǁ")
            assert f"def {function}(" in source, (module.path, name)
            assert not owner or f"class {owner[-1]}" in source, (module.path, name)
        for test in module.tests:
            path, _, name = test.partition("::")  # a file, or one test of it
            assert (root / path).exists(), (module.key, test)
            assert not name or f"def {name}(" in (root / path).read_text(), (module.key, test)
