"""`make test` names every missing prerequisite, with the command that provides it, first."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bin" / "check-test-prereqs"


def _check(*urls: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run(
        ["bash", str(SCRIPT), *urls], capture_output=True, text=True, env=env, timeout=60
    )


def test_servers_that_do_not_answer_are_named_with_what_to_do():
    result = _check("postgres://postgres@127.0.0.1:1/x", "redis://127.0.0.1:1/0")
    assert result.returncode == 1
    assert "missing a PostgreSQL server at 127.0.0.1:1; start it" in result.stderr
    assert "missing a Redis server answering redis://127.0.0.1:1/0; start it" in result.stderr


def test_a_missing_tool_is_named_with_the_package_that_provides_it(tmp_path):
    """Every tool the suite runs is there but promtool: only promtool is named."""
    tools = ["pg_isready", "redis-cli", "redis-server", "initdb", "bash", "sed"]
    for tool in tools:
        if found := shutil.which(tool):
            (tmp_path / tool).symlink_to(found)
    result = _check(
        "postgres://postgres@127.0.0.1:5432/x", "redis://127.0.0.1:6379/0", path=str(tmp_path)
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "make test: missing promtool (the alert rules' tests); "
        "apt-get install --no-install-recommends prometheus"
    ]


def test_all_present_passes_silently():
    result = _check("postgres://postgres@127.0.0.1:5432/x", "redis://127.0.0.1:6379/0")
    assert (result.returncode, result.stderr) == (0, "")
