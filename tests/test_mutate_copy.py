"""`make mutate` copies every app the settings load into mutants/ (pyproject's [tool.mutmut])."""

import tomllib
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]


def test_mutmut_copies_every_local_app_and_the_translations():
    """mutmut runs the tests in its own copy of the project: an app left out fails every
    module at Django's setup ("No module named 'intake'", once intake had landed)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    copied = {path.rstrip("/") for path in [*config["source_paths"], *config["also_copy"]]}
    local = {app.split(".")[0] for app in settings.INSTALLED_APPS}
    local = {name for name in local if (ROOT / name / "__init__.py").exists()}
    assert local - copied == set()
    assert "locale" in copied  # the rendering tests' German and French words
