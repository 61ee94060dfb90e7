"""README's "Running on PostgreSQL and Redis", run as a new user would type it."""

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support.processes import Proc, process_env
from tests.support.races import wait_until

ROOT = Path(__file__).resolve().parents[2]
# A new user's shell: the virtualenv is not on it.
PLAIN_PATH = "/usr/bin:/bin"


def _steps() -> list[str]:
    """Return the section's shell lines, without their comments."""
    section = (ROOT / "README.md").read_text().split("## Running on PostgreSQL and Redis", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_honcho_finds_the_procfiles_programs():
    """The Procfile runs gunicorn and celery by name: the steps must put the
    virtualenv's on the PATH, or every process stops with 'celery: not found'."""
    steps = [
        step for step in _steps() if not step.startswith("export ") and "manage.py" not in step
    ]
    script = "\n".join(steps).replace(
        "honcho start", "honcho run sh -c 'command -v gunicorn && command -v celery'"
    )
    found = subprocess.run(
        ["bash", "-ec", script],
        cwd=ROOT,
        env={**os.environ, "PATH": PLAIN_PATH},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stdout + found.stderr
    venv = (ROOT / ".venv" / "bin").resolve()
    assert [Path(path).resolve().parent for path in found.stdout.split()] == [venv, venv]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.django_db(transaction=True)
def test_the_steps_start_a_web_that_serves_the_admin(tmp_path):
    """With DEBUG off, web serves the admin's files from the manifest collectstatic writes:
    without it, every admin page is a 500 (Missing staticfiles manifest entry)."""
    socket_path = tmp_path / "web.sock"
    env = process_env(
        PATH=PLAIN_PATH,
        REMINDERS_VAR_DIR=str(tmp_path),
        WEB_BIND=f"unix:{socket_path}",
        ALLOWED_HOSTS="web",
    )
    env.pop("DEBUG", None)
    steps = [step for step in _steps() if not step.startswith("export ")]
    web = Proc(["bash", "-ec", "\n".join(steps).replace("honcho start", "exec honcho start web")],
               env, "web")  # fmt: skip
    try:
        wait_until(lambda: socket_path.exists() or web.popen.poll() is not None, timeout=120)
        assert socket_path.exists(), web.output()
        # The socket is bound before gunicorn's workers have loaded Django: on a loaded host
        # the first answer takes more than httpx's 5 s.
        transport = httpx.HTTPTransport(uds=str(socket_path))
        with httpx.Client(transport=transport, timeout=60) as client:
            login = client.get("http://web/admin/login/")
            style = client.get("http://web/static/admin/css/base.css")
    finally:
        web.stop()
    assert (login.status_code, style.status_code) == (200, 200), web.output()
