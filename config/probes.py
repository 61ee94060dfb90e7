"""Probes for an orchestrator: ``/healthz`` (the process is up) and ``/readyz`` (it can work).

``/readyz`` checks the database and the broker, each in a thread of its own
with one deadline of PROBE_TIMEOUT seconds, so a server that hangs cannot hang
the probe; a check still hung is waited on again, not started in another
thread, and never delays the other. The answer names the check that failed and the kind of failure,
never a URL, a version or a message that could carry a secret. One check
runs at a time and its answer serves every request for READY_CACHE seconds,
so a flood of probes costs one check a second, not one each.

``ProbeMiddleware``, first in MIDDLEWARE, answers both paths before Django
validates the Host header (ALLOWED_HOSTS) or redirects to HTTPS: an
orchestrator probes the container's own address over plain http.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse

from clock import default_clock

PROBE_TIMEOUT = 2.0
READY_CACHE = 1.0
_pools = {
    name: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"readyz-{name}")
    for name in ("database", "broker")
}
_running: dict[str, Future] = {}
_checking = threading.Lock()
# (monotonic time it was taken, body, status) of the last check.
_last: tuple[float, dict, int] | None = None


class ProbeMiddleware:
    """Serve /healthz and /readyz ahead of the rest of the middleware."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        probe = PROBES.get(request.path_info)
        return probe(request) if probe is not None else self.get_response(request)


def healthz(request) -> HttpResponse:
    """Answer 200 while the process serves requests; touches nothing else."""
    return HttpResponse("ok\n", content_type="text/plain")


def readyz(request) -> JsonResponse:
    """Answer 200 when the database and the broker answer within PROBE_TIMEOUT, else 503."""
    global _last
    with _checking:  # the others wait for this check and share its answer
        now = default_clock().monotonic()
        if _last is None or now - _last[0] >= READY_CACHE:
            _last = (now, *_check())
        _, body, status = _last
    return JsonResponse(body, status=status)


def _check() -> tuple[dict, int]:
    checks = {"database": _database, "broker": _broker}
    for name, check in checks.items():
        if name not in _running or _running[name].done():
            _running[name] = _pools[name].submit(check)
    wait([_running[name] for name in checks], timeout=PROBE_TIMEOUT)
    results = {}
    for name in checks:
        future = _running[name]
        if not future.done():
            results[name] = f"no answer within {PROBE_TIMEOUT:g} s"
        elif (exc := future.exception()) is not None:  # the kind only: it may quote a URL
            results[name] = f"failed ({type(exc).__name__})"
        else:
            results[name] = "ok"
    ready = all(value == "ok" for value in results.values())
    return {"status": "ready" if ready else "not ready", "checks": results}, (200 if ready else 503)


def _database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()  # this thread's own connection


def _broker() -> None:
    url = settings.CELERY_BROKER_URL
    if url.startswith("filesystem://"):
        folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        if not folder.is_dir():
            raise FileNotFoundError("broker folder missing")
        return
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
    )
    try:
        client.ping()
    finally:
        client.close()


PROBES = {"/healthz": healthz, "/readyz": readyz}
