"""Settings from the environment: a bad value stops start-up with a message naming the variable."""

import os
from pathlib import Path

import pytest

from tests.support import forkstart

ROOT = Path(__file__).resolve().parents[2]


def _start(*, show: str = "", **env: str):
    """Set Django up under ``env``; with ``show``, print that setting's value."""
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REMINDERS_", "EMAIL_", "DEBUG", "SECRET_KEY", "TIME_ZONE"))
    }
    base.update({"SECRET_KEY": "x" * 40, "REMINDERS_VAR_DIR": str(ROOT / "var" / "test")})
    base.update(env)
    return forkstart.run(
        "import django; django.setup()"
        + (f"; from django.conf import settings; print(repr(settings.{show}))" if show else ""),
        cwd=ROOT,
        env=base,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"REMINDERS_CUTOFF_MINUTES": "half an hour"},
            "REMINDERS_CUTOFF_MINUTES must be a whole number of minutes from 0 to 1440; "
            "got 'half an hour'.",
        ),
        (
            {"REMINDERS_SCAN_INTERVAL": "0"},
            "REMINDERS_SCAN_INTERVAL must be a whole number of seconds from 5 to 3600; got 0.",
        ),
        (
            {"REMINDERS_CHANNEL": "pigeon"},
            "REMINDERS_CHANNEL must be one of file, smtp, http, django; got 'pigeon'.",
        ),
        (
            {"REMINDERS_KEY_PREFIX": "clé"},
            "REMINDERS_KEY_PREFIX must be 1-20 ASCII letters, digits, '-' or '_'; got 'clé'.",
        ),
        (
            {"REMINDERS_REDIS_URL": "redis-host:6379"},
            "REMINDERS_REDIS_URL must be a redis:// or rediss:// URL",
        ),
        (
            {"LOG_LEVEL": "verbose"},
            "LOG_LEVEL must be one of debug, info, warning, error, critical; got 'verbose'.",
        ),
        ({"DEBUG": "maybe"}, "DEBUG must be a boolean"),
        ({"SECRET_KEY": "", "DEBUG": "0"}, "SECRET_KEY must be set when DEBUG is off"),
        (
            {"REMINDERS_LEAD_MINUTES": "20", "REMINDERS_CUTOFF_MINUTES": "30"},
            "REMINDERS_LEAD_MINUTES (20) must be greater than REMINDERS_CUTOFF_MINUTES (30)",
        ),
        (
            {"REMINDERS_CHANNEL": "http"},
            "REMINDERS_HTTP_URL must be set when REMINDERS_CHANNEL=http",
        ),
        ({"CELERY_BROKER_URL": "amqp://guest@localhost//"}, "CELERY_BROKER_URL must be redis://"),
        # Accepted, these failed at the first connection with "Port could not be cast to
        # integer value as 'abc'", naming no variable (every API request's cache call).
        ({"CELERY_BROKER_URL": "redis://127.0.0.1:abc/0"}, "CELERY_BROKER_URL must be redis://"),
        (
            {"REMINDERS_REDIS_URL": "redis://127.0.0.1:abc/0"},
            "REMINDERS_REDIS_URL must be a redis:// or rediss:// URL",
        ),
        ({"DATABASE_URL": "oracle-ish://nope"}, "DATABASE_URL must be a database URL"),
        ({"REMINDERS_RATE_LIMIT": "-1"}, "REMINDERS_RATE_LIMIT must be a whole number"),
        (
            {"REMINDERS_API_RATE": "lots"},
            "REMINDERS_API_RATE must look like '600/minute' (a count per second, minute or "
            "hour), not 'lots'.",
        ),
        ({"REMINDERS_API_RATE": "0/minute"}, "REMINDERS_API_RATE must look like"),
        (
            {"REMINDERS_METRICS_PORT": "70000"},
            "REMINDERS_METRICS_PORT must be a whole number from 0 to 65535; got 70000. "
            "0 or unset: no metrics port.",
        ),
        (
            {"TIME_ZONE": "europe/berlin"},
            "TIME_ZONE: europe/berlin is not a known time zone; write it exactly as Europe/Berlin.",
        ),
        (
            {"TIME_ZONE": "CET+1"},
            "TIME_ZONE: CET+1 is not a known time zone; use an IANA name such as Europe/Berlin.",
        ),
    ],
)
def test_invalid_value_fails_at_start_up_naming_the_variable(env, message):
    result = _start(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


@pytest.mark.parametrize(("value", "zone"), [(None, "UTC"), ("", "UTC"), ("Europe/Berlin", None)])
def test_time_zone_is_the_staffs_zone_read_from_the_environment(value, zone):
    """tests/admin/test_staff_zone.py: what the admin does with it."""
    started = _start(show="TIME_ZONE", **({} if value is None else {"TIME_ZONE": value}))
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == repr(zone or value)


@pytest.mark.parametrize("value", ["0", "", "9808"])
def test_a_metrics_port_of_0_or_empty_is_off_as_a_template_default_gives_it(value):
    """`REMINDERS_METRICS_PORT: ${REMINDERS_METRICS_PORT:-0}` in a deployment template starts a
    worker without the port, as leaving it unset does (reminders.worker.telemetry: 0 is off)."""
    started = _start(show="REMINDERS_METRICS_PORT", REMINDERS_METRICS_PORT=value)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == (value or "0")


@pytest.mark.parametrize(
    ("hedges", "said"),
    [
        (
            "https://b.example/r,https://b.example/r",
            "REMINDERS_HTTP_HEDGE_URLS lists 'https://b.example/r' twice "
            "(as 'https://b.example/r'): every reminder would be posted to that endpoint twice. "
            "List each endpoint once.",
        ),
        # The same endpoint, written another way: host case, the default port, a trailing slash.
        (
            "https://b.example/r,HTTPS://B.Example:443/r/",
            "REMINDERS_HTTP_HEDGE_URLS lists 'https://b.example/r' twice "
            "(as 'https://B.Example:443/r/')",
        ),
        (
            "https://A.example/r/",
            "REMINDERS_HTTP_HEDGE_URLS lists REMINDERS_HTTP_URL 'https://a.example/r' "
            "(as 'https://A.example/r/'): every reminder would be posted to that endpoint twice. "
            "List only the other endpoints in REMINDERS_HTTP_HEDGE_URLS.",
        ),
    ],
    ids=["repeated", "repeated-written-otherwise", "the-primary-written-otherwise"],
)
def test_a_hedge_url_naming_an_endpoint_already_listed_is_refused(hedges, said):
    refused = _start(REMINDERS_HTTP_URL="https://a.example/r", REMINDERS_HTTP_HEDGE_URLS=hedges)
    assert refused.returncode != 0 and said in refused.stderr, refused.stderr[-600:]
    other = _start(
        REMINDERS_HTTP_URL="https://a.example/r",
        REMINDERS_HTTP_HEDGE_URLS="https://b.example/r,https://c.example/r,https://b.example/r2",
    )
    assert other.returncode == 0, other.stderr


SHORT = "0123456789abcdefghijklmnopqrstu"  # 31 characters


@pytest.mark.parametrize(
    "env",
    [
        {"SECRET_KEY": SHORT},
        {"METRICS_TOKEN": SHORT},
        {
            "REMINDERS_CHANNEL": "http",
            "REMINDERS_HTTP_URL": "https://n.example/r",
            "REMINDERS_HTTP_SECRET": SHORT,
        },
        {"REMINDERS_HTTP_CALLBACK_SECRET": SHORT},
    ],  # fmt: skip
    ids=["SECRET_KEY", "METRICS_TOKEN", "REMINDERS_HTTP_SECRET", "REMINDERS_HTTP_CALLBACK_SECRET"],
)
def test_a_secret_shorter_than_32_characters_is_refused_with_debug_off(env, request):
    name = request.node.callspec.id
    refused = _start(DEBUG="0", **env)
    assert refused.returncode != 0
    assert f"{name} is 31 characters; with DEBUG off it needs at least 32" in refused.stderr
    assert "secrets.token_urlsafe(32)" in refused.stderr
    assert SHORT not in refused.stderr
    assert _start(DEBUG="0", **{**env, name: SHORT + "v"}).returncode == 0


def test_defaults_start_without_any_server():
    """The local run needs no variables: SQLite and the filesystem broker under var/."""
    result = forkstart.run(
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.REMINDERS_CHANNEL, "
        "s.DATABASES['default']['OPTIONS']['transaction_mode'])",
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DEBUG": "1",
            "REMINDERS_VAR_DIR": str(ROOT / "var" / "test-defaults"),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.sqlite3",
        "filesystem://",
        "file",
        "IMMEDIATE",
    ]


PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "a-long-random-production-like-secret-key-0123456789-abcdefghijklmnop",
    "ALLOWED_HOSTS": "reminders.example.com",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/reminders",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    "REMINDERS_CHANNEL": "smtp",
}
# The only findings of `check --deploy` on the production defaults, each an
# operator's decision documented in the README ("Production checklist").
DOCUMENTED_DEPLOY_WARNINGS = {"security.W004", "security.W008"}


def _check_deploy(**env: str) -> set[str]:
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REMINDERS_", "EMAIL_", "DEBUG", "SECRET_KEY", "SECURE_"))
    }
    base.update(PRODUCTION, **env)
    result = forkstart.manage("check", "--deploy", cwd=ROOT, env=base)
    # Warnings leave the exit code at 0; a crash (or an error-level check) does not.
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified" in result.stdout + result.stderr
    found = set()
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith("?: (") or line.startswith("reminders."):
            found.add(line.split("(", 1)[1].split(")", 1)[0])
    return found


def test_check_deploy_reports_only_the_documented_operator_decisions():
    assert _check_deploy() == DOCUMENTED_DEPLOY_WARNINGS


def test_check_deploy_is_clean_once_tls_settings_are_given():
    assert (
        _check_deploy(
            SECURE_HSTS_SECONDS="31536000",
            SECURE_HSTS_INCLUDE_SUBDOMAINS="1",
            SECURE_HSTS_PRELOAD="1",
            SECURE_SSL_REDIRECT="1",
            BEHIND_TLS_PROXY="1",
        )
        == set()
    )


def test_migration_check_runs_without_a_secret_key():
    """makemigrations --check compares files only; it must not need production secrets."""
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    env["REMINDERS_VAR_DIR"] = str(ROOT / "var" / "test")
    result = forkstart.manage("makemigrations", "--check", "--dry-run", cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    assert "No changes detected" in result.stdout


def test_other_commands_still_need_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    result = forkstart.manage("check", cwd=ROOT, env=env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"REMINDERS_PUBLIC_URL": "reminders.example.com"}, "is not an http(s) address"),
        ({"REMINDERS_PUBLIC_URL": "http://reminders.example.com"}, "must be https://"),
        # The links are appended to it: after a '#' or a '?' they would lead nowhere.
        ({"REMINDERS_PUBLIC_URL": "https://example.com/#/reminders"}, "is not an http(s) address"),
        ({"REMINDERS_PUBLIC_URL": "https://reminders.example.com?"}, "is not an http(s) address"),
        ({"REMINDERS_DKIM_SELECTOR": "r1"}, "Set both REMINDERS_DKIM_SELECTOR"),
        (
            {"REMINDERS_DKIM_SELECTOR": "r1", "REMINDERS_DKIM_KEY_FILE": "/nonexistent/k.pem"},
            "cannot be read",
        ),
        # A directory passes a read-permission check; opening it as the key file would not.
        ({"REMINDERS_DKIM_SELECTOR": "r1", "REMINDERS_DKIM_KEY_FILE": str(ROOT)}, "cannot be read"),
    ],
    ids=[
        "not-a-url",
        "plain-http",
        "fragment",
        "empty-query",
        "selector-alone",
        "unreadable-key",
        "key-is-a-directory",
    ],
)
def test_the_attendee_links_and_dkim_settings_refuse_what_cannot_work(env, said):
    refused = _start(DEBUG="0", SECRET_KEY=SHORT + "v", **env)
    assert refused.returncode != 0 and said in refused.stderr
