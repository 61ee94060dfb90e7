"""A benchmark stopped by a signal stops what it started (bench.harness.run_program).

Its servers run in sessions of their own, so only the driver's own unwinding can
reach them: this starts a real redis-server through the harness, sends SIGTERM to the
driver alone, and looks for the server afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from bench.harness import CLOCK, ROOT

DRIVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from bench.harness import CLOCK, PrivateRedis, run_program


    def main():
        redis = PrivateRedis(Path(sys.argv[1]))
        redis.start()
        try:
            print(redis.process.pid, flush=True)
            CLOCK.sleep_blocking(60)
        finally:
            redis.close()
        return 0


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


def test_a_terminated_benchmark_stops_the_server_it_started(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, str(driver), str(tmp_path / "redis")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    server = int(process.stdout.readline())
    try:
        assert _alive(server)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 128 + signal.SIGTERM
        deadline = CLOCK.monotonic() + 10
        while _alive(server) and CLOCK.monotonic() < deadline:
            CLOCK.sleep_blocking(0.05)
        assert not _alive(server), "the driver's redis-server outlived it"
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)
        process.kill()
        process.wait(10)
