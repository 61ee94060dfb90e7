"""gunicorn's access log carries no query string or referrer (issue 34, item 4): an
admin search such as ``?q=jane.doe@example.org`` went to the log in plain text,
outside Django's logging and its redaction. And web says at start-up what
BEHIND_TLS_PROXY=1 trusts (item 19)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.races import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = "jane.doe%40example.org"


def test_the_access_log_names_the_path_but_not_the_query_or_the_referrer(tmp_path):
    socket_path = tmp_path / "web.sock"
    log = tmp_path / "web.log"
    env = {**os.environ, "DEBUG": "1", "PYTHONUNBUFFERED": "1", "BEHIND_TLS_PROXY": "1"}
    with log.open("w") as out:
        web = subprocess.Popen(
            [str(Path(sys.executable).with_name("gunicorn")), "-c", "config/gunicorn.py",
             "--bind", f"unix:{socket_path}", "--workers", "1", "config.wsgi"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(socket_path.exists, timeout=30, what="gunicorn to listen")
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path))) as client:
            answer = client.get(
                f"http://web/healthz?q={ADDRESS}",
                headers={"Referer": f"http://web/admin/workshops/attendee/?q={ADDRESS}"},
            )
        assert answer.status_code == 200
        wait_until(lambda: "/healthz" in log.read_text(), timeout=10, what="the access log")
    finally:
        web.terminate()
        web.wait(10)
    lines = [line for line in log.read_text().splitlines() if "/healthz" in line]
    assert len(lines) == 1 and '"GET /healthz HTTP/1.1" 200' in lines[0], lines
    assert "jane.doe" not in log.read_text() and "?q=" not in log.read_text()
    # Issue 34, item 19: the start-up says what trusting X-Forwarded-Proto assumes.
    assert "safe only when web is reachable through a proxy that sets this header" in (
        log.read_text()
    )
