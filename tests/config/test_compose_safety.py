"""docker-compose.yml is safe by default: it needs the operator's secrets, listens on
loopback, and its production environment passes ``manage.py check --deploy`` clean."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(TEXT)
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}
REFERENCE = re.compile(r"\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
REQUIRED = ("SECRET_KEY", "POSTGRES_PASSWORD")


class Refused(Exception):
    """Compose would stop before starting anything, with this message."""


def interpolate(value: str, given: dict[str, str]) -> str:
    """Resolve ``value`` the way ``docker compose`` does, from the operator's ``given``."""

    def one(match: re.Match) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        present = name in given and (given[name] != "" or op not in (":-", ":?"))
        if present:
            return given[name]
        if op in (":?", "?"):
            raise Refused(f"{name}: {arg}")
        return arg if op in (":-", "-") else ""

    return REFERENCE.sub(one, value)


def app_environment(given: dict[str, str]) -> dict[str, str]:
    return {k: interpolate(str(v), given) for k, v in COMPOSE["x-app"]["environment"].items()}


def test_compose_refuses_to_start_without_each_secret_and_says_which():
    operator = {"SECRET_KEY": "s" * 50, "POSTGRES_PASSWORD": "chosen-by-the-operator"}
    assert app_environment(operator)["DATABASE_URL"].startswith(
        "postgres://reminders:chosen-by-the-operator@"
    )
    for name in REQUIRED:
        without = {k: v for k, v in operator.items() if k != name}
        for given in (without, {**without, name: ""}):
            with pytest.raises(Refused, match=rf"^{name}: Set {name} "):
                app_environment(given)
            if name == "POSTGRES_PASSWORD":
                with pytest.raises(Refused, match=rf"^{name}: Set {name} "):
                    interpolate(str(COMPOSE["services"]["postgres"]["environment"]), given)
    # No reference to a secret anywhere carries a default.
    for match in REFERENCE.finditer(TEXT):
        if match["name"] in REQUIRED:
            assert match["op"] == ":?", match.group(0)
    assert "change-me" not in TEXT


def test_every_published_port_listens_on_loopback_unless_the_operator_says_otherwise():
    published = [
        (name, port) for name, spec in COMPOSE["services"].items() for port in spec.get("ports", [])
    ]
    assert {name for name, _ in published} == {"web", "mailpit", "flower"}
    for name, port in published:
        host = interpolate(str(port), {}).split(":")
        assert len(host) == 3 and host[0] == "127.0.0.1", (name, port)
    assert interpolate(str(COMPOSE["services"]["web"]["ports"][0]), {"WEB_BIND": "0.0.0.0"}) == (
        "0.0.0.0:8000:8000"
    )


def test_cookies_are_secure_and_debug_off_whatever_the_environment_says():
    env = COMPOSE["x-app"]["environment"]
    for name in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        assert env[name] == "1", name
    assert env["DEBUG"] == "0"


def test_images_are_pinned_to_a_version():
    for name, spec in COMPOSE["services"].items():
        image = spec.get("image")
        if spec.get("build") or image is None:
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and re.fullmatch(r"v?\d+(\.\d+)+", tag), (name, image)


def test_production_environment_passes_check_deploy_clean(tmp_path):
    operator = {"SECRET_KEY": "k" * 8 + "-Q7x2" * 10, "POSTGRES_PASSWORD": "chosen"}
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REMINDERS_", "EMAIL_", "DEBUG", "SECRET_KEY", "SECURE_"))
    }
    env.update(app_environment(operator), REMINDERS_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr


def test_web_and_workers_have_probes_that_exist():
    """compose's healthchecks call the probe path and the Celery ping the project provides."""
    from config.probes import PROBES

    web = " ".join(COMPOSE["services"]["web"]["healthcheck"]["test"])
    path = re.search(r"http://127\.0\.0\.1:8000(/\w+)", web).group(1)
    assert path == "/readyz" and path in PROBES
    worker = " ".join(COMPOSE["services"]["worker"]["healthcheck"]["test"])
    assert "celery -A config inspect ping --destination celery@$$HOSTNAME" in worker
