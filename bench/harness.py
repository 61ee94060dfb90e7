"""Private servers and real project processes for bench/chaos.py and bench/e2e.py.

Everything here runs on 127.0.0.1 and belongs to the run that started it, so
the run may stop, kill and restart it freely:

- ``PrivatePostgres``: a throwaway cluster (``initdb`` into a temporary
  directory, ``pg_ctl`` on a free port). PostgreSQL refuses to run as root, so
  when the harness runs as root every server command runs as the ``postgres``
  OS user through ``runuser``.
- ``PrivateRedis``: ``redis-server`` on a free port with no persistence, so a
  restart loses the queues, as a crashed Redis without AOF would.
- ``Proc``: one child process in its own process group (``celery -A config
  worker`` / ``beat``), its output in a log file; ``signal_group`` reaches
  the pool children too, ``signal_main`` only the main process (as Docker
  and ``KillMode=mixed`` do).
- ``SinkProcess``: ``bench.sinks`` (the loopback SMTP or HTTP sink) as a
  process, controlled over its stdin, logging every request to JSONL.
- ``MemorySampler``: peak RSS and PSS of process trees, from /proc.
- ``run_program``: a program's entry point, so that SIGTERM or SIGHUP (``kill``,
  ``timeout``, a closed terminal) unwinds it as Ctrl-C does and its
  ``finally`` blocks stop what it started, which lives in sessions of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from clock import SystemClock

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CELERY = str(Path(sys.executable).with_name("celery"))
CLOCK = SystemClock()


# Everything a run starts that outlives it unless stopped: whether it still runs, and
# how to stop it. A class adds itself when it starts a process and removes itself when
# stopped; a worker a chaos step killed stays listed, and is found dead at the end.
_STARTED: dict[int, tuple[Callable[[], bool], Callable[[], object]]] = {}
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _started(owner: object, *, alive: Callable[[], bool], stop: Callable[[], object]) -> None:
    _STARTED[id(owner)] = (alive, stop)


def _stopped(owner: object) -> None:
    _STARTED.pop(id(owner), None)


def stop_leftovers() -> int:
    """Stop whatever a run started and left running, newest first; return how many."""
    count = 0
    while _STARTED:
        _, (alive, stop) = _STARTED.popitem()
        with contextlib.suppress(Exception):
            if alive():
                stop()
                count += 1
    return count


def run_program(main: Callable[[], int]) -> NoReturn:
    """Exit with ``main()``'s status, stopping every server and worker it left running.

    The servers and workers a run starts are in sessions of their own (a kill
    step signals a worker's group without reaching the driver), so a signal
    to the driver alone would leave them running. The first SIGINT, SIGTERM
    or SIGHUP raises ``SystemExit`` in the main thread, so the ``finally``
    blocks that stop them run, and makes the driver deaf to the next ones (a
    signal that lands inside a cleanup cannot cut it short twice); a signal
    the driver was started deaf to (``nohup``) stays so. Whatever a cleanup
    missed is stopped at the end (``stop_leftovers``). ``kill -9`` still
    leaves them.
    """
    watched = [each for each in _STOP_SIGNALS if signal.getsignal(each) is not signal.SIG_IGN]

    def unwind(signum, frame):
        for each in watched:
            signal.signal(each, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for each in watched:
        signal.signal(each, unwind)
    try:
        status = main()
    finally:
        for each in watched:
            signal.signal(each, signal.SIG_IGN)
        left = stop_leftovers()
        if left:
            print(f"stopped {left} server(s) or worker(s) the run left running", file=sys.stderr)
    raise SystemExit(status)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_workdir(prefix: str, keep_in: Path | None = None) -> Path:
    """Create a fresh directory for one run's servers and logs.

    Readable and traversable by others: the PostgreSQL server runs as the
    ``postgres`` user when we are root and must reach its data directory.
    """
    base = keep_in or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    directory.chmod(0o755)
    return directory


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``predicate`` until it is true; raise ``TimeoutError`` naming ``what``."""
    deadline = CLOCK.monotonic() + timeout
    while CLOCK.monotonic() < deadline:
        if predicate():
            return
        CLOCK.sleep_blocking(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


# --- PostgreSQL ---------------------------------------------------------------


def _pg_bin() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if candidates:
        return candidates[0].parent
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise SystemExit(
        "No PostgreSQL server binaries found: install postgresql (initdb and pg_ctl are "
        "looked up in /usr/lib/postgresql/*/bin and on PATH)."
    )


def _as_postgres(argv: list[str]) -> list[str]:
    """Return ``argv`` run as the postgres OS user when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


class PrivatePostgres:
    """A PostgreSQL cluster of our own on a free port, in ``directory``."""

    def __init__(
        self, directory: Path, *, durable: bool = True, stat_statements: bool = False
    ) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.log = directory / "postgres.log"
        self.port = free_port()
        self.bin = _pg_bin()
        self._durable = durable
        self._stat_statements = stat_statements

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        result = subprocess.run(
            _as_postgres([str(self.bin / argv[0]), *argv[1:]]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} failed ({result.returncode}): {result.stderr.strip()[-2000:]}"
            )

    def init(self) -> PrivatePostgres:
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--no-sync", "--locale=C.UTF-8",
        )  # fmt: skip
        return self

    def start(self) -> None:
        options = [
            f"-p {self.port}",
            f"-k {self.directory}",
            "-c listen_addresses=127.0.0.1",
            "-c max_connections=200",
            # A lock waited on for longer than deadlock_timeout (1 s) is logged, with
            # who held it: a slow staff change in a chaos run can then be explained.
            "-c log_lock_waits=on",
        ]
        if not self._durable:
            # A throwaway chaos cluster: a crash of the *machine* is not a fault we model.
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        _started(self, alive=(self.data / "postmaster.pid").exists, stop=self.close)
        if self._stat_statements:
            options += [
                "-c shared_preload_libraries=pg_stat_statements",
                "-c pg_stat_statements.max=20000",
                "-c pg_stat_statements.track=top",
                "-c pg_stat_statements.track_utility=on",
            ]
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "-o", " ".join(options), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, *, down_for: float) -> None:
        """Stop with ``-m fast`` (every session is terminated), stay down, start again."""
        self.stop("fast")
        CLOCK.sleep_blocking(down_for)
        self.start()

    def execute(self, sql: str, *, database: str = "postgres", params=None) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=10) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def close(self) -> None:
        _stopped(self)
        with contextlib.suppress(Exception):
            self.stop("immediate")


@contextlib.contextmanager
def django_on_private_postgres(prefix: str, database: str, *, keep: bool = False, **env: str):
    """Start a PostgreSQL cluster of our own, migrate ``database`` on it and set Django up
    in this process against it; stop and remove the cluster when the block ends.

    ``env`` adds settings (``REMINDERS_RATE_LIMIT="0"``...). The broker URL points
    at a Redis database nothing is published to. Yields the work directory.
    """
    workdir = make_workdir(prefix)
    postgres = PrivatePostgres(workdir / "pg", durable=True)
    try:
        postgres.init()
        postgres.start()
        postgres.execute(f"CREATE DATABASE {database}")
        settings = {
            "DATABASE_URL": postgres.url(database),
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SECRET_KEY": "bench-only-not-secret-0a1b2c3d4e5f6a7b",
            "DEBUG": "0",
            "LOG_LEVEL": "WARNING",
            "REMINDERS_VAR_DIR": str(workdir / "var"),
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/12",  # never published to
            **env,
        }
        manage({**os.environ, **settings}, "migrate", "--verbosity", "0")
        os.environ.update(settings)
        import django

        django.setup()
        yield workdir
    finally:
        postgres.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


# --- Redis --------------------------------------------------------------------


class PrivateRedis:
    """``redis-server`` on a free port with no persistence: a restart empties it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.log = directory / "redis.log"
        self.process: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _started(
            self,
            alive=lambda: self.process is not None and self.process.poll() is None,
            stop=self.close,
        )
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.directory),
                "--logfile", str(self.log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        wait_until(self.ping, timeout=20, what="redis-server to answer PING")

    def ping(self) -> bool:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def client(self, db: int = 0):
        import redis

        return redis.Redis(port=self.port, db=db, socket_timeout=5, socket_connect_timeout=5)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def restart(self, *, down_for: float) -> None:
        """Stop (SIGTERM, nothing saved: every queue is lost), stay down, start again."""
        self.stop()
        CLOCK.sleep_blocking(down_for)
        self.start()

    def close(self) -> None:
        _stopped(self)
        self.stop()


# --- Processes ----------------------------------------------------------------


class Proc:
    """A child process in its own process group, its output appended to a log file."""

    def __init__(self, argv: list[str], env: Mapping[str, str], name: str, logs: Path) -> None:
        self.name = name
        self.argv = argv
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.started_at = CLOCK.monotonic()
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _started(self, alive=lambda: bool(self.group_pids()), stop=lambda: self.stop(timeout=10))

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count(self, needle: str) -> int:
        return self.text().count(needle)

    def wait_for(self, needle: str, *, timeout: float = 90) -> None:
        def seen() -> bool:
            if not self.alive:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            return needle in self.text()

        try:
            wait_until(seen, timeout=timeout, what=f"{self.name} to log {needle!r}", interval=0.2)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.tail()}") from None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def group_pids(self) -> list[int]:
        """Return every live process of this process group (main and pool children)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == self.popen.pid:
                pids.append(int(entry.name))
        return pids

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def signal_main(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 30) -> int:
        """Warm-stop the main process; kill the whole group if it is not gone in ``timeout``."""
        _stopped(self)
        if self.alive:
            self.signal_main(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.signal_group(signal.SIGKILL)
                self.popen.wait(10)
        # Pool children orphaned by a kill of the main process still hold the group.
        self.signal_group(signal.SIGKILL)
        self._log.close()
        return self.popen.returncode


def celery_worker(
    env: Mapping[str, str],
    name: str,
    logs: Path,
    *,
    concurrency: int = 2,
    extra: tuple[str, ...] = (),
) -> Proc:
    """Start ``celery -A config worker`` (the Procfile's command) named ``name``."""
    argv = [
        CELERY, "-A", "config", "worker", "--loglevel=INFO", f"--concurrency={concurrency}",
        f"--hostname={name}@%h", "--without-mingle", "--without-gossip", *extra,
    ]  # fmt: skip
    return Proc(argv, env, name, logs)


def celery_beat(env: Mapping[str, str], name: str, logs: Path) -> Proc:
    """Start ``celery -A config beat`` (django-celery-beat's DatabaseScheduler)."""
    argv = [
        CELERY, "-A", "config", "beat", "--loglevel=INFO",
        f"--pidfile={logs / (name + '.pid')}", f"--schedule={logs / (name + '.db')}",
    ]  # fmt: skip
    return Proc(argv, env, name, logs)


def manage(env: Mapping[str, str], *args: str, timeout: float = 300) -> str:
    """Run ``manage.py`` with ``env``; return its output, raise with it on failure."""
    result = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


PYCACHE = Path(tempfile.gettempdir()) / "workshop-reminders-bench-pycache"


def python_env() -> dict[str, str]:
    """Return this environment for a Python child: unbuffered, bytecode cached (see base_env)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=str(PYCACHE))
    return env


def base_env(**overrides: str) -> dict[str, str]:
    """Return the environment of a project process: settings module, unbuffered output.

    Bytecode is cached (under ``PYCACHE``, outside the work tree) even where
    the shell sets PYTHONDONTWRITEBYTECODE, as it is on this machine: a
    deployed worker has its .pyc files, and compiling every module again in
    each new process would bill start-up and lazy imports to the run.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REMINDERS_", "CELERY_", "EMAIL_", "DATABASE_URL"))
        and key != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPYCACHEPREFIX": str(PYCACHE),
            "SECRET_KEY": "bench-only-not-secret-0a1b2c3d4e5f6a7b",
            "DEBUG": "0",
        }
    )
    env.update(overrides)
    return env


# --- Sinks --------------------------------------------------------------------


class SinkProcess:
    """``python -m bench.sinks smtp|http`` as a child process, controlled over its stdin."""

    def __init__(self, kind: str, logs: Path, *args: str) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.kind = kind
        self.jsonl = logs / f"{kind}_sink.jsonl"
        self.jsonl.write_text("")
        self._stderr = (logs / f"{kind}_sink.log").open("ab")
        self.process = subprocess.Popen(
            [PYTHON, "-m", "bench.sinks", kind, "--jsonl", str(self.jsonl), *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=python_env(),
            start_new_session=True,
        )
        _started(self, alive=lambda: self.process.poll() is None, stop=self.close)
        line = self.process.stdout.readline().strip()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError(f"{kind} sink did not start: {line!r}")
        self.address = line.rsplit(" ", 1)[1]
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1].split("/")[0])

    def control(self, **changes) -> dict:
        """Apply ``changes`` in the sink (e.g. ``data_delay=1.0``); return its acknowledgement."""
        with self._lock:
            self.process.stdin.write(json.dumps(changes) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline().strip()
        if not answer.startswith("ok "):
            raise RuntimeError(f"{self.kind} sink refused {changes}: {answer!r}")
        return json.loads(answer[3:])

    def records(self) -> list[dict]:
        """Return every request the sink logged (see bench.sinks for the fields)."""
        records = []
        for line in self.jsonl.read_text().splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records

    def close(self) -> None:
        _stopped(self)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._stderr.close()


# --- CPU and memory -------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def family(pid: int) -> list[int]:
    """Return ``pid`` and its direct children (pool processes, PostgreSQL backends)."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and int(fields[1]) == pid:
                pids.append(int(entry.name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """Return the user + system CPU time the live processes ``pids`` have used so far, with
    that of their children that exited and were waited for: a PostgreSQL backend that
    disconnected counts in its postmaster's, not nowhere."""
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields:
            total += sum(int(field) for field in fields[11:15])  # utime, stime, cutime, cstime
    return total / _TICKS


def postmaster_pid(postgres: PrivatePostgres) -> int:
    return int((postgres.data / "postmaster.pid").read_text().split()[0])


def _memory_kb(pid: int) -> tuple[int, int]:
    """Return (RSS, PSS) of one process in kB, from /proc/PID/smaps_rollup."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


@dataclass
class TreePeak:
    rss_sum_kb: int = 0
    pss_sum_kb: int = 0
    rss_max_kb: int = 0
    processes: int = 0


@dataclass
class MemorySampler:
    """Sample each named process tree every ``interval`` s and keep the peaks."""

    procs: dict[str, Proc]
    interval: float = 0.5
    peaks: dict[str, TreePeak] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        for name, proc in list(self.procs.items()):
            pids = proc.group_pids()
            if not pids:
                continue
            readings = [_memory_kb(pid) for pid in pids]
            peak = self.peaks.setdefault(name, TreePeak())
            peak.rss_sum_kb = max(peak.rss_sum_kb, sum(r for r, _ in readings))
            peak.pss_sum_kb = max(peak.pss_sum_kb, sum(p for _, p in readings))
            peak.rss_max_kb = max(peak.rss_max_kb, max(r for r, _ in readings))
            peak.processes = max(peak.processes, len(pids))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, TreePeak]:
        self._stop.set()
        self._thread.join(5)
        return self.peaks


# --- Results ------------------------------------------------------------------

RESULTS = ROOT / "bench" / "results"


def stamp() -> dict:
    """Return the commit the figures were measured at, whether the tree had changes, and the date."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    changed = [
        line for line in git("status", "--porcelain").splitlines() if "bench/results/" not in line
    ]
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "unknown",
        "tree": "modified" if changed else "clean",
        "date": CLOCK.now().date().isoformat(),
    }


def results_path(name: str, commit: str, directory: Path = RESULTS) -> Path:
    """Return where a run of benchmark ``name`` at ``commit`` keeps its figures."""
    return directory / f"{name}-{commit}.json"


def saveable(name: str, *, now: dict | None = None, directory: Path = RESULTS) -> dict:
    """Return the stamp a ``--save`` of ``name`` will carry, or refuse it (``SystemExit``).

    A results file belongs to one commit and never changes once written (the docs
    quote it; tests/test_bench_results.py), so a save is refused from a tree with
    changes (outside bench/results/: the figures would belong to no commit) and when
    that commit's file exists. Called before the run too, so a refused save costs
    seconds, not the run's minutes.
    """
    now = now or stamp()
    if now["commit"] == "unknown":
        raise SystemExit("--save refused: no git commit to stamp the figures with")
    if now["tree"] != "clean":
        raise SystemExit(
            f"--save refused: the tree differs from HEAD ({now['commit']}), so the "
            "figures would belong to no commit; commit or stash them first "
            "(`git status` lists them; bench/results/ is left out)"
        )
    path = results_path(name, now["commit"], directory)
    if path.exists():
        raise SystemExit(
            f"--save refused: {path.relative_to(directory.parent.parent)} exists, and a results "
            "file never changes once written; run at a new commit, or without --save"
        )
    return now


def save_results(
    name: str, figures: dict, *, now: dict | None = None, directory: Path = RESULTS
) -> Path:
    """Write ``bench/results/NAME-<commit>.json`` once, never over an existing file.

    ``figures`` carries the stamp ``saveable`` returned before the run; the save is
    refused when HEAD moved or the tree changed during the run, as before it.
    """
    now = now or stamp()
    if now["commit"] != figures["commit"]:
        raise SystemExit(
            f"--save refused: HEAD moved from {figures['commit']} to {now['commit']} during "
            "the run, so the figures belong to neither; run again"
        )
    saveable(name, now=now, directory=directory)
    path = results_path(name, figures["commit"], directory)
    directory.mkdir(exist_ok=True)
    with path.open("x") as out:  # "x": another run that got here first is not overwritten
        out.write(json.dumps(figures, indent=2) + "\n")
    return path.relative_to(directory.parent.parent)
