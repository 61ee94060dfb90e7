"""LOG_FORMAT=json: one JSON object per line, extra fields kept, secrets still masked
(issue 13, item 2, in part)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from tests.support import forkstart

ROOT = Path(__file__).resolve().parents[2]
CODE = """
import django, logging
django.setup()
log = logging.getLogger("reminders.worker.bridge")
log.warning("posting to %s", "https://n.example.com/r?token=Tk-1234", extra={"reminder_id": 42, "key": "rem-w1-a1", "endpoint": "https://u:Tk-1234@h.example.com/x?sig=Tk-1234"})
try:
    raise ConnectionError("redis://:Tk-1234@r:6379/0 refused\\nsecond line")
except ConnectionError:
    logging.getLogger("reminders.worker.scanlane").exception("Scan lane lost the broker")
"""


def _run(**env: str):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOG_", "REMINDERS_"))}
    base.update({"SECRET_KEY": "x" * 40, "REMINDERS_VAR_DIR": str(ROOT / "var" / "test")}, **env)
    return forkstart.run(CODE, cwd=ROOT, env=base)


def test_json_lines_carry_time_level_logger_message_and_the_callers_fields():
    result = _run(LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert len(lines) == 2, result.stderr
    first, second = lines
    assert {k: first[k] for k in ("level", "logger", "reminder_id", "key")} == {
        "level": "WARNING", "logger": "reminders.worker.bridge", "reminder_id": 42, "key": "rem-w1-a1",
    }  # fmt: skip
    assert first["message"] == "posting to https://n.example.com/r?token=***"
    # Every string field is redacted, not only the message (issue 34, item 7).
    assert first["endpoint"] == "https://u:***@h.example.com/x?sig=***"
    assert datetime.fromisoformat(first["time"]).utcoffset().total_seconds() == 0
    assert second["message"] == "Scan lane lost the broker"
    assert "ConnectionError: redis://:***@r:6379/0 refused" in second["exc_info"]
    assert "Tk-1234" not in result.stderr


def test_text_stays_the_default():
    result = _run()
    assert result.returncode == 0, result.stderr
    assert not result.stderr.lstrip().startswith("{")
    assert " WARNING reminders.worker.bridge posting to https://n.example.com/r?token=***" in (
        result.stderr
    )


def test_an_unknown_log_format_is_refused_by_name():
    result = _run(LOG_FORMAT="xml")
    assert result.returncode != 0
    assert "LOG_FORMAT must be one of text, json; got 'xml'." in result.stderr


def test_with_debug_on_djangos_request_lines_are_written_once_and_masked():
    """Django adds a console handler of its own to its loggers under DEBUG (make run sets
    it): each django.request line was written a second time past the redaction, with the
    whole token of an attendee's link and any URL's password."""
    code = (
        "import django, logging\n"
        "django.setup()\n"
        "logging.getLogger('django.request').warning(\n"
        "    'Not Found: /attend/17.Tk-1234/ from https://u:Tk-1234@h.example.com/')\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOG_", "REMINDERS_"))}
    base.update({"SECRET_KEY": "x" * 40, "REMINDERS_VAR_DIR": str(ROOT / "var" / "test")})
    result = forkstart.run(code, cwd=ROOT, env={**base, "DEBUG": "1"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "Not Found" in line]
    assert len(lines) == 1 and "Tk-1234" not in result.stderr, result.stderr
