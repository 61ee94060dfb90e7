"""Secrets stay out of text: start-up errors, log lines and Django's error page (issue 11,
item 5). Each test plants one secret, runs the real path and greps what came out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import forkstart

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Pw-51d2e8b0"


def _python(code: str, **env: str):
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("REMINDERS_", "EMAIL_", "DEBUG", "SECRET_KEY", "LOG_"))
    }
    base.update({"SECRET_KEY": "x" * 40, "REMINDERS_VAR_DIR": str(ROOT / "var" / "test")}, **env)
    return forkstart.run(code, cwd=ROOT, env=base)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CELERY_BROKER_URL": f"amqp://app:{SECRET}@mq:5672//"}, "CELERY_BROKER_URL"),
        ({"DATABASE_URL": f"nosuchdb://app:{SECRET}@db/x"}, "DATABASE_URL"),
        (
            {
                "REMINDERS_HTTP_HEDGE_URLS": f"ftp://app:{SECRET}@h/x",
                "REMINDERS_HTTP_URL": "https://a/r",
            },
            "REMINDERS_HTTP_HEDGE_URLS",
        ),
    ],
)
def test_a_start_up_error_names_the_variable_but_not_its_password(env, named):
    result = _python("import django; django.setup()", **env)
    assert result.returncode != 0
    assert named in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_the_channel_check_refuses_plain_http_without_echoing_its_token():
    result = _python(
        "import django; django.setup(); from django.core.management import call_command; "
        "call_command('check')",
        REMINDERS_CHANNEL="http",
        REMINDERS_HTTP_URL=f"http://notify.example.com/r?token={SECRET}",
        REMINDERS_HTTP_SECRET="s" * 32,
    )
    assert result.returncode != 0
    assert "REMINDERS_HTTP_ALLOW_INSECURE=1" in result.stderr
    assert "token=***" in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_every_log_line_has_its_urls_redacted_whichever_library_wrote_it():
    code = f"""
import django, logging
django.setup()
logging.getLogger("httpx").info('HTTP Request: POST %s "HTTP/1.1 500"', "https://h/r?token={SECRET}")
logging.getLogger("kombu").warning("Cannot connect to redis://:{SECRET}@r:6379/0")
try:
    raise ConnectionError("redis://:{SECRET}@r:6379/0 refused")
except ConnectionError:
    logging.getLogger("reminders.worker.scanlane").exception("Scan lane lost the broker")
"""
    result = _python(code, LOG_LEVEL="INFO")
    assert result.returncode == 0, result.stderr
    assert "token=***" in result.stderr
    assert "redis://:***@r:6379/0" in result.stderr
    assert "Traceback" in result.stderr and "refused" in result.stderr
    assert SECRET not in result.stderr


def test_the_debug_error_page_hides_broker_redis_and_http_urls(rf, settings, monkeypatch):
    from django.views.debug import technical_500_response

    settings.DEBUG = True
    settings.CELERY_BROKER_URL = f"redis://:{SECRET}@redis:6379/0"
    settings.REMINDERS_REDIS_URL = f"redis://:{SECRET}@redis:6379/1"
    settings.REMINDERS_HTTP_URL = f"https://n.example.com/r?token={SECRET}"
    settings.REMINDERS_HTTP_HEDGE_URLS = [f"https://m.example.com/r?token={SECRET}"]
    monkeypatch.setenv("DATABASE_URL", f"postgres://app:{SECRET}@db/x")
    request = rf.get("/admin/", **{"DATABASE_URL": f"postgres://app:{SECRET}@db/x"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        response = technical_500_response(request, *sys.exc_info())
    page = response.content.decode()
    assert "CELERY_BROKER_URL" in page and "boom" in page
    assert SECRET not in page
