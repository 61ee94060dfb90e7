"""What web, under the gunicorn that serves it in production, writes and answers.

The access log carries no query string or referrer (issue 34, item 4): an admin search
such as ``?q=jane.doe@example.org`` went to the log in plain text, outside Django's
logging and its redaction. Web says at start-up what BEHIND_TLS_PROXY=1 trusts (item 19).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from reminders.links import LINK_TOKEN
from tests.support.races import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = "jane.doe%40example.org"


@contextlib.contextmanager
def web(tmp_path: Path, **env: str):
    """Run gunicorn with config/gunicorn.py on a socket; yield a client of it and its log."""
    socket_path, log = tmp_path / "web.sock", tmp_path / "web.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("gunicorn")), "-c", "config/gunicorn.py",
             "--bind", f"unix:{socket_path}", "--workers", "1", "config.wsgi"],
            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(socket_path.exists, timeout=30, what="gunicorn to listen")
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path))) as client:
            yield client, log
    finally:
        process.terminate()
        process.wait(10)


def test_the_access_log_names_the_path_but_not_the_query_or_the_referrer(tmp_path):
    with web(tmp_path, DEBUG="1", BEHIND_TLS_PROXY="1") as (client, log):
        answer = client.get(
            f"http://web/healthz?q={ADDRESS}",
            headers={"Referer": f"http://web/admin/workshops/attendee/?q={ADDRESS}"},
        )
        assert answer.status_code == 200
        wait_until(lambda: "/healthz" in log.read_text(), timeout=10, what="the access log")
    lines = [line for line in log.read_text().splitlines() if "/healthz" in line]
    assert len(lines) == 1 and '"GET /healthz HTTP/1.1" 200' in lines[0], lines
    assert "jane.doe" not in log.read_text() and "?q=" not in log.read_text()
    # Issue 34, item 19: the start-up says what trusting X-Forwarded-Proto assumes.
    assert "safe only when web is reachable through a proxy that sets this header" in (
        log.read_text()
    )


def test_a_chunked_report_without_a_length_is_told_to_send_one_not_that_its_signature_failed(
    tmp_path,
):
    """gunicorn hands Django a chunked body without its Content-Length, which Django reads
    as empty: a provider's signed report was refused "Signature refused" (401), a fault it
    cannot find in its signature. It is now a 411 saying to send Content-Length; the same
    report with one gets past that to the signature check."""
    body = b'{"events": []}'
    secret = "callback-secret-0a1b2c3d4e5f6a7b8c9d"
    with web(tmp_path, DEBUG="1", REMINDERS_HTTP_CALLBACK_SECRET=secret) as (client, _):
        chunked = client.post("http://localhost/hooks/http/events", content=iter([body]))
        assert chunked.request.headers["Transfer-Encoding"] == "chunked"
        sized = client.post("http://localhost/hooks/http/events", content=body)
    assert chunked.status_code == 411, chunked.text
    assert "Content-Length" in chunked.json()["detail"]
    assert sized.status_code == 401  # unsigned: judged by its signature, as before


def test_the_logs_keep_the_id_of_an_attendees_link_but_not_its_signature(tmp_path):
    """Whoever holds /attend/<token>/ or /unsubscribe/<token>/ cancels that attendee's place or
    stops their messages: the access log wrote every click's token whole, and Django's warning
    of a 404 or a 410 under the links wrote it again."""
    signatures = [secrets.token_urlsafe(32) for _ in range(2)]
    paths = [f"/attend/17.{signatures[0]}/", f"/unsubscribe/17.{signatures[1]}/"]
    with web(tmp_path, DEBUG="0", ALLOWED_HOSTS="localhost") as (client, log):
        answers = [client.get(f"http://localhost{path}").status_code for path in paths]
        assert answers == [404, 404]
        wait_until(lambda: "/unsubscribe/" in log.read_text(), timeout=10, what="the access log")
    text = log.read_text()
    assert '"GET /attend/17.***/ HTTP/1.1" 404' in text, text
    assert "Not Found: /unsubscribe/17.***/" in text, text
    assert not [signature for signature in signatures if signature in text], text


def test_the_access_log_masks_links_as_djangos_log_lines_do():
    """config/gunicorn.py is read before Django is set up, so it keeps its own copy of the
    pattern that masks an attendee's link: the two must stay the same."""
    assert importlib.import_module("config.gunicorn").LINK_TOKEN.pattern == LINK_TOKEN.pattern
