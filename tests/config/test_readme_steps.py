"""README's "Running on PostgreSQL and Redis", run as a new user would type it."""

import os
import subprocess
from pathlib import Path

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
