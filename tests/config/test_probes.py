"""/healthz and /readyz: up, ready, or which dependency is not, and never a secret
(issue 13, item 5)."""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

SECRET = "Pw-7c0ffee"


@pytest.fixture(autouse=True)
def fresh_readiness(monkeypatch):
    """Each test sees its own check, not the answer cached by the one before."""
    monkeypatch.setattr("config.probes._last", None)


@pytest.mark.django_db
def test_healthz_answers_without_touching_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok\n")


@pytest.mark.django_db(transaction=True)
def test_readyz_is_ready_when_the_database_and_redis_answer(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert json.loads(response.content) == {
        "status": "ready", "checks": {"database": "ok", "broker": "ok"},
    }  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_readyz_names_a_dead_broker_and_never_its_url(client, settings, refusing_port):
    settings.CELERY_BROKER_URL = f"redis://:{SECRET}@127.0.0.1:{refusing_port()}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    body = json.loads(response.content)
    assert body["status"] == "not ready" and body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("failed (")
    assert SECRET not in response.content.decode() and "127.0.0.1" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_readyz_names_a_database_that_refuses_connections(client, monkeypatch):
    # A stopped PostgreSQL, as the connection reports it (the test database must stay up).
    def refuse(self):
        raise OperationalError(f"connection to server failed: password {SECRET}")

    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", refuse)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert json.loads(response.content)["checks"] == {
        "database": "failed (OperationalError)", "broker": "ok",
    }  # fmt: skip
    assert SECRET not in response.content.decode()


def test_probes_answer_any_host_over_plain_http_while_everything_else_is_checked(client, settings):
    """An orchestrator probes the container's address over http: no HTTPS redirect, and
    a Host outside ALLOWED_HOSTS still gets its answer."""
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["reminders.example.com"]
    assert client.get("/healthz", HTTP_HOST="10.0.3.7:8000").status_code == 200
    assert client.get("/admin/", HTTP_HOST="10.0.3.7:8000").status_code == 400
    assert client.get("/admin/", HTTP_HOST="reminders.example.com").status_code == 301


@pytest.mark.django_db(transaction=True)
def test_a_flood_of_readiness_probes_costs_one_check_a_second(client, monkeypatch, clock):
    """Issue 34, item 15: 40 probes at once ran 40 checks, each a fresh connection;
    now one check serves them all until READY_CACHE has passed."""
    import threading

    from django.db import connections

    from config import probes

    calls: list[str] = []
    real_database = probes._database

    def counted_database() -> None:
        calls.append("database")
        real_database()

    monkeypatch.setattr(probes, "_database", counted_database)
    monkeypatch.setattr(probes, "_broker", lambda: calls.append("broker"))
    statuses: list[int] = []

    def probe() -> None:
        try:
            statuses.append(client.get("/readyz").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=probe) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert statuses == [200] * 40
    assert sorted(calls) == ["broker", "database"]

    clock.advance(probes.READY_CACHE)
    assert client.get("/readyz").status_code == 200
    assert sorted(calls) == ["broker", "broker", "database", "database"]


@pytest.mark.django_db
def test_a_hung_database_is_not_blamed_on_the_broker_and_holds_one_thread(monkeypatch, clock):
    """A database that never answers (a hung server, not a refused connection): each probe
    names it, waits on the check already running rather than hanging another thread, and the
    broker's own check, which answers, stays "ok"."""
    import threading

    from config import probes

    hung = threading.Event()
    started: list[str] = []

    def hanging_database() -> None:
        started.append("database")
        hung.wait(30)

    # Long enough for the broker's check, which returns at once, on a loaded host.
    monkeypatch.setattr(probes, "PROBE_TIMEOUT", 1.0)
    monkeypatch.setattr(probes, "_database", hanging_database)
    monkeypatch.setattr(probes, "_broker", lambda: None)
    try:
        answers = []
        for _ in range(3):
            answers.append(probes._check()[0]["checks"])
            clock.advance(probes.READY_CACHE)
    finally:
        hung.set()
    assert answers == [{"database": "no answer within 1 s", "broker": "ok"}] * 3
    assert started == ["database"]
