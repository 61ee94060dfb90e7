"""Start and stop real project processes (Celery workers, beat) for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from django.db import connection

from clock import SystemClock

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))
_clock = SystemClock()


def process_env(**overrides: str) -> dict[str, str]:
    """Return an environment pointing a child process at the test database and broker."""
    settings = connection.settings_dict
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": (
                f"postgres://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:"
                f"{settings['PORT'] or 5432}/{settings['NAME']}"
            ),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


class Proc:
    """A child process in its own process group, with its output collected."""

    def __init__(self, argv: list[str], env: Mapping[str, str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            if " ready." in line or "beat: Starting" in line:
                self._ready.set()

    @property
    def ready(self) -> bool:
        """Whether the process said it is ready (a worker's " ready.", beat's start)."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float = 60) -> None:
        if not self._ready.wait(timeout):
            raise AssertionError(f"{self.name} not ready after {timeout} s:\n{self.output()}")

    def wait_for_line(self, text: str, timeout: float = 30) -> str:
        deadline = _clock.monotonic() + timeout
        while _clock.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.popen.poll() is not None:
                break
            _clock.sleep_blocking(0.05)
        raise AssertionError(f"{self.name}: no line with {text!r}:\n{self.output()}")

    def output(self) -> str:
        return "\n".join(self.lines[-200:])

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 20) -> int:
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait(10)
        self._reader.join(5)
        return self.popen.returncode


def worker_argv(*, concurrency: int = 1, name: str = "worker", extra: tuple = ()) -> list[str]:
    """Return ``celery -A config worker``'s command line, as the Procfile runs it."""
    return [
        CELERY, "-A", "config", "worker", "--loglevel=INFO", f"--concurrency={concurrency}",
        f"--hostname={name}@%h", "--without-mingle", "--without-gossip", *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def celery_worker(
    env: Mapping[str, str], *, concurrency: int = 1, name: str = "worker", extra: tuple = ()
) -> Iterator[Proc]:
    """Run ``celery -A config worker`` (the same command as the Procfile) until the block ends."""
    proc = Proc(worker_argv(concurrency=concurrency, name=name, extra=extra), env, name)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def serving_on_a_new_port(
    start: Callable[[int], Proc],
    *,
    listening: Callable[[Proc, int], bool],
    attempts: int = 3,
    timeout: float = 60,
) -> Iterator[tuple[Proc, int]]:
    """Run ``start(port)``, a server that binds ``port`` itself, on a port the system just
    handed out, until the block ends.

    The port is free when the system hands it out; another process may take it before
    the server binds it. The server then exits, which is seen before ``listening`` is
    trusted, and a new port is tried.
    """
    proc = None
    for _attempt in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        proc = start(port)
        deadline = _clock.monotonic() + timeout
        up = False
        while proc.popen.poll() is None and _clock.monotonic() < deadline:
            if listening(proc, port) and proc.popen.poll() is None:
                up = True
                break
            _clock.sleep_blocking(0.1)
        if up:
            try:
                yield proc, port
            finally:
                proc.stop()
            return
        exited = proc.popen.poll() is not None
        proc.stop()
        if not exited:
            raise AssertionError(f"{proc.name} not listening after {timeout} s:\n{proc.output()}")
    assert proc is not None
    raise AssertionError(f"{proc.name} exited on {attempts} ports:\n{proc.output()}")


def run_on_sqlite(script: str, var_dir) -> dict:
    """Run ``script`` in a fresh interpreter on the local run's SQLite database (and broker)
    under ``var_dir``; return the JSON object its last line prints."""
    import json
    import subprocess
    import sys

    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "CELERY_BROKER_URL")
    }
    env.update(DEBUG="1", REMINDERS_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="config.settings")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
