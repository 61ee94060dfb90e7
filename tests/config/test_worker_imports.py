"""A worker process loads the send path, not the web's API libraries: django-ninja, pydantic
and requests would cost each worker process memory it never uses. ninja is no installed app,
and the checks Celery's Django fix-up runs as a worker starts (which import the URLconf) are
skipped (config/celery.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = """
import json, sys
import django
django.setup()
from celery.fixups.django import DjangoWorkerFixup
from config.celery import app
import reminders.tasks, reminders.worker.hooks
from reminders.worker import bridge, pipeline
DjangoWorkerFixup(app).validate_models()  # what a worker runs as it imports its task modules
web = {"ninja", "pydantic", "requests"}
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules} & web)))
"""


def test_a_worker_process_imports_no_library_only_the_web_uses():
    env = {k: v for k, v in os.environ.items() if k != "CELERY_SKIP_CHECKS"}  # config's own
    env.update(SECRET_KEY="x" * 40, REMINDERS_VAR_DIR=str(ROOT / "var" / "test"))
    result = subprocess.run(
        [sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
