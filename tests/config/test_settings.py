"""Settings from the environment: a bad value stops start-up with a message naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _start(**env: str) -> subprocess.CompletedProcess:
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REMINDERS_", "EMAIL_", "DEBUG", "SECRET_KEY"))
    }
    base.update({"SECRET_KEY": "x", "REMINDERS_VAR_DIR": str(ROOT / "var" / "test")})
    base.update(env)
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
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
        ({"DATABASE_URL": "oracle-ish://nope"}, "DATABASE_URL must be a database URL"),
        ({"REMINDERS_RATE_LIMIT": "-1"}, "REMINDERS_RATE_LIMIT must be a whole number"),
    ],
)
def test_invalid_value_fails_at_start_up_naming_the_variable(env, message):
    result = _start(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_defaults_start_without_any_server():
    """The local run needs no variables: SQLite and the filesystem broker under var/."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.REMINDERS_CHANNEL, "
            "s.DATABASES['default']['OPTIONS']['transaction_mode'])",
        ],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DEBUG": "1",
            "REMINDERS_VAR_DIR": str(ROOT / "var" / "test-defaults"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.sqlite3",
        "filesystem://",
        "file",
        "IMMEDIATE",
    ]
