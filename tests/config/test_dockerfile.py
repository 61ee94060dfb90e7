"""The Dockerfile's rules, read from the file (there is no Docker engine to build it here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    """Return (INSTRUCTION, arguments) pairs, with continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_the_processes_run_as_an_unprivileged_user_that_owns_var():
    steps = _instructions()
    users = [arg for word, arg in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    last_user = max(i for i, (word, _) in enumerate(steps) if word == "USER")
    runs = [arg for word, arg in steps[:last_user] if word == "RUN"]
    collect = next(i for i, arg in enumerate(runs) if "collectstatic" in arg)
    chowns = [i for i, arg in enumerate(runs) if re.search(r"chown -R \S+ /app/var\b", arg)]
    # var/ is made by collectstatic as root: it must be handed over, recursively, after it.
    assert chowns and max(chowns) >= collect, runs
    assert any(word == "RUN" and users[-1] in arg for word, arg in steps), "user never created"


def test_base_image_and_uv_are_pinned():
    froms = [arg for word, arg in _instructions() if word == "FROM"]
    assert froms
    for image in froms:
        name, _, tag = image.split("@")[0].partition(":")
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim-\w+", tag), image
    runs = [arg for word, arg in _instructions() if word == "RUN"]
    installs = [arg for arg in runs if re.search(r"\bpip install\b.*\buv\b", arg)]
    assert installs and all(re.search(r"\buv==\d+\.\d+\.\d+", arg) for arg in installs), runs
    # The project's own dependencies come from the lock file only.
    assert any("uv sync --locked" in arg for arg in runs), runs


def test_secrets_and_local_state_stay_out_of_the_build_context():
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".env", ".env.*", ".venv", "var", ".git"} <= ignored
    assert {"**/.env", "**/.env.*"} <= ignored  # a nested one too (issue 34, item 19)
