"""docker-compose.yml and the Procfile refer only to things that exist in the project."""

import importlib
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _check_command(argv: list[str]) -> None:
    program = Path(argv[0]).name
    if program == "celery" and argv[1] == "flower":
        importlib.import_module("flower")  # no project code: only the broker
    elif program == "celery":
        assert argv[1:3] == ["-A", "config"]
        assert importlib.import_module("config").celery_app.main == "reminders"
        assert argv[3] in {"worker", "beat", "flower"}
        if argv[3] == "flower":
            importlib.import_module("flower")
    elif program == "gunicorn":
        # gunicorn -c config/gunicorn.py [--bind ADDRESS] MODULE[:ATTRIBUTE]
        assert argv[1:3] == ["-c", "config/gunicorn.py"], "web runs with the project's config"
        assert (ROOT / argv[2]).exists()
        module, _, attribute = argv[-1].partition(":")
        assert hasattr(importlib.import_module(module), attribute or "application")
    elif program == "python":
        assert argv[1] == "manage.py"
        assert (ROOT / "manage.py").exists()
        from django.core.management import get_commands

        assert argv[2] in get_commands()
    else:
        raise AssertionError(f"unexpected program {program!r} in {argv}")


def test_every_app_service_command_refers_to_existing_modules():
    services = _compose()["services"]
    app_services = {name: spec for name, spec in services.items() if spec.get("build")}
    assert set(app_services) == {"migrate", "web", "worker", "beat", "flower"}
    for name, spec in app_services.items():
        _check_command(spec["command"])
        assert spec["environment"]["CELERY_BROKER_URL"].startswith("redis://")
        if name != "flower":
            assert spec["environment"]["DATABASE_URL"].startswith("postgres://")


def test_compose_has_exactly_one_beat_and_the_backing_services():
    services = _compose()["services"]
    assert {"postgres", "redis", "mailpit", "web", "worker", "beat"} <= set(services)
    beats = [
        name
        for name, spec in services.items()
        if spec.get("command", [])[:4] == ["celery", "-A", "config", "beat"]
    ]
    assert beats == ["beat"]
    assert services["beat"]["deploy"]["replicas"] == 1


def test_procfile_commands_match_compose():
    procfile = dict(
        line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    assert set(procfile) == {"web", "worker", "beat"}
    services = _compose()["services"]
    for name in ("worker", "beat"):
        assert shlex.split(procfile[name]) == services[name]["command"]
    for line in procfile.values():
        _check_command(shlex.split(line))


def test_flower_listens_on_this_machine_only_and_refuses_to_start_without_basic_auth():
    """Flower shows every task's arguments and can revoke tasks: never open, never anonymous."""
    flower = _compose()["services"]["flower"]
    assert flower["ports"] == ["${FLOWER_BIND:-127.0.0.1}:5555:5555"]
    auth = flower["environment"]["FLOWER_BASIC_AUTH"]
    assert auth.startswith("${FLOWER_BASIC_AUTH:?"), "compose must refuse to start without it"
    # It reads the same broker as the workers, so their events need no extra setting.
    worker = _compose()["services"]["worker"]
    assert flower["environment"]["CELERY_BROKER_URL"] == worker["environment"]["CELERY_BROKER_URL"]


def test_flower_gets_the_broker_and_no_other_secret():
    """Least privilege (issue 34, item 19): Flower loads no project code, so it needs
    neither SECRET_KEY nor the database password."""
    flower = _compose()["services"]["flower"]
    assert "-A" not in flower["command"]
    assert set(flower["environment"]) == {
        "CELERY_BROKER_URL", "FLOWER_BASIC_AUTH", "FLOWER_PURGE_OFFLINE_WORKERS",
    }  # fmt: skip


def test_the_mail_relays_tls_mode_and_login_reach_the_app():
    """Issue 34, item 11: a real relay's settings can be given to compose at all."""
    environment = _compose()["x-app"]["environment"]
    for name in ("EMAIL_USE_TLS", "EMAIL_USE_SSL", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD"):
        assert environment[name].startswith(f"${{{name}:-"), name


def test_workers_serve_their_metrics_on_the_compose_network_and_publish_no_port():
    """Each replica serves its series where a Prometheus on the network can scrape it;
    nothing reaches the host, and the worker keeps every other variable of the app."""
    services = _compose()["services"]
    worker = services["worker"]
    assert worker["environment"]["REMINDERS_METRICS_PORT"] == "9808"
    assert worker["environment"]["REMINDERS_METRICS_BIND"] == "0.0.0.0"
    assert "ports" not in worker
    assert worker["environment"]["DATABASE_URL"] == services["web"]["environment"]["DATABASE_URL"]
    scrape = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert ":9808" in scrape
