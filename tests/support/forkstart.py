"""Run short Python programs as fresh processes, forked from one that has imported the libraries.

The settings tests start Django under dozens of environments; a new interpreter spends most of
a second importing Django, Celery and the drivers before it reads a single variable. Here one
server process per test process imports those once, then forks a child per program: the child
gets the given environment, working directory and ``sys.argv``, runs the code as ``__main__``
and exits as an interpreter would (1 and a traceback on stderr for an uncaught exception, the
code of a ``SystemExit``). Nothing of the project is imported before the fork, so each child
reads its settings from scratch.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading

# Imported once by the server; none reads a setting at import time.
PRELOAD = (
    "django.db.models",
    "django.http",
    "django.urls",
    "django.forms",
    "django.template",
    "django.core.management",
    "celery",
    "kombu",
    "redis",
    "redis.asyncio",
    "psycopg",
)

_SERVER = r"""
import importlib, json, os, signal, sys, tempfile, traceback
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
for line in sys.stdin:
    job = json.loads(line)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        code = 0
        # The bound subprocess.run(timeout=60) gave: a hung start ends, and the next job
        # still gets its own answer.
        signal.signal(signal.SIGALRM, lambda *_: (os.write(2, b"killed after 60 s\n"), os._exit(124)))
        signal.alarm(60)
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            sys.argv = job["argv"]
            sys.path[0] = job["cwd"]
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    status = os.waitpid(pid, 0)[1]
    returncode = os.waitstatus_to_exitcode(status)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode("utf-8", "replace"))
        f.close()
    print(json.dumps([returncode, *texts]), flush=True)
"""

_lock = threading.Lock()
_server: subprocess.Popen | None = None


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, json.dumps(PRELOAD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        )
        atexit.register(_server.kill)
    return _server


def run(
    code: str, *, env: dict[str, str], cwd: str, argv: list[str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh forked process; the result reads as ``subprocess.run``'s."""
    job = {"code": code, "env": env, "cwd": str(cwd), "argv": argv or ["-c"]}
    with _lock:
        server = _started()
        server.stdin.write(json.dumps(job) + "\n")
        server.stdin.flush()
        answer = server.stdout.readline()
    if not answer:
        raise RuntimeError(f"the fork server died (exit {server.wait()})")
    returncode, stdout, stderr = json.loads(answer)
    return subprocess.CompletedProcess(argv or ["-c", code], returncode, stdout, stderr)


def manage(*args: str, env: dict[str, str], cwd: str) -> subprocess.CompletedProcess:
    """Run ``manage.py args`` as ``python manage.py args`` would, forked."""
    code = "import runpy; runpy.run_path('manage.py', run_name='__main__')"
    return run(code, env=env, cwd=cwd, argv=["manage.py", *args])
