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
REQUIRED = ("SECRET_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD")
# What an operator exports (README, "Running with docker compose").
OPERATOR = {
    "SECRET_KEY": "s" * 50,
    "POSTGRES_PASSWORD": "chosen-by-the-operator",
    "REDIS_PASSWORD": "5e1f0c2a9b7d4e3f8a6c1b0d2e4f6a8c",
    "FLOWER_BASIC_AUTH": "ops:chosen-too",
}


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


def interpolate_all(node, given: dict[str, str]):
    """The whole file as compose sees it once interpolated (it refuses on the first
    missing required variable, before starting anything)."""
    if isinstance(node, dict):
        return {key: interpolate_all(value, given) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_all(value, given) for value in node]
    return interpolate(node, given) if isinstance(node, str) else node


def strings(node):
    """Every string value in the parsed file (YAML aliases resolved), comments excluded."""
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def test_compose_refuses_to_start_without_each_secret_and_says_which():
    operator = OPERATOR
    interpolate_all(COMPOSE, operator)  # all given: the whole file resolves
    assert app_environment(operator)["DATABASE_URL"].startswith(
        "postgres://reminders:chosen-by-the-operator@"
    )
    for name in REQUIRED:
        without = {k: v for k, v in operator.items() if k != name}
        for given in (without, {**without, name: ""}):
            with pytest.raises(Refused, match=rf"^{name}: Set {name} "):
                app_environment(given)
            with pytest.raises(Refused, match=rf"^{name}: Set {name} "):
                interpolate_all(COMPOSE, given)
            if name == "POSTGRES_PASSWORD":
                with pytest.raises(Refused, match=rf"^{name}: Set {name} "):
                    interpolate(str(COMPOSE["services"]["postgres"]["environment"]), given)
    # No reference to a secret anywhere carries a default.
    for match in REFERENCE.finditer(TEXT):
        if match["name"] in REQUIRED:
            assert match["op"] == ":?", match.group(0)
    assert "change-me" not in TEXT


def test_redis_asks_for_its_password_and_compose_refuses_to_start_without_one():
    """Issue 34, item 17: any container on the compose network could otherwise publish
    tasks or tell the workers to shut down."""
    redis = COMPOSE["services"]["redis"]
    for given in (
        {k: v for k, v in OPERATOR.items() if k != "REDIS_PASSWORD"},
        {**OPERATOR, "REDIS_PASSWORD": ""},
    ):
        # Redis itself, and each of its clients, refuses on its own.
        for part in (redis, COMPOSE["x-app"]["environment"], COMPOSE["services"]["flower"]):
            with pytest.raises(Refused) as refused:
                interpolate_all(part, given)
            # The message says how to make one that is safe inside a URL.
            assert str(refused.value).startswith("REDIS_PASSWORD: Set REDIS_PASSWORD "), refused
            assert "secrets.token_hex(32)" in str(refused.value), refused
    password = OPERATOR["REDIS_PASSWORD"]
    resolved = interpolate_all(redis, OPERATOR)
    command = resolved["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--requirepass") + 1] == password, command


def test_every_redis_url_and_redis_cli_carries_the_password():
    """Every client of Redis in the file (the app's broker and rate limiter, Flower, any
    healthcheck) authenticates; redis-cli gets the password from REDISCLI_AUTH, never
    from its command line, where ``ps`` and ``docker inspect`` would show it."""
    password = OPERATOR["REDIS_PASSWORD"]
    resolved = interpolate_all(COMPOSE, OPERATOR)
    urls = [url for value in strings(resolved) for url in re.findall(r"rediss?://[^\s'\"]*", value)]
    assert urls, "no Redis URL found"
    for url in urls:
        assert url.split("://", 1)[1].startswith(f":{password}@"), url
    # Every service that talks to Redis gets such a URL.
    for name, spec in resolved["services"].items():
        if spec.get("build") or "redis" in spec.get("depends_on", {}):
            broker = spec["environment"]["CELERY_BROKER_URL"]
            assert broker == f"redis://:{password}@redis:6379/0", (name, broker)
    # redis-cli: the password through the environment only.
    clis = 0
    for name, spec in resolved["services"].items():
        test = " ".join(spec.get("healthcheck", {}).get("test", []))
        if "redis-cli" in test:
            clis += 1
            assert spec["environment"]["REDISCLI_AUTH"] == password, name
            assert password not in test and not re.search(r"\s(-a|--pass|--user)\b", test), test
            # An unauthenticated ping is answered NOAUTH, which must not count as healthy.
            assert "PONG" in test, test
    assert clis, "the redis service has no redis-cli healthcheck"


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
    """A full version, optionally with the OS variant (postgres: 16.10-bookworm);
    the floors below which a version may not go are in test_compose_pins.py."""
    for name, spec in COMPOSE["services"].items():
        image = spec.get("image")
        if spec.get("build") or image is None:
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and re.fullmatch(r"v?\d+(\.\d+)+(-[a-z]+)?", tag), (name, image)


def test_production_environment_passes_check_deploy_clean(tmp_path):
    operator = {**OPERATOR, "SECRET_KEY": "k" * 8 + "-Q7x2" * 10, "POSTGRES_PASSWORD": "chosen"}
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
