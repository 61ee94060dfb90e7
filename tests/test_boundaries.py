"""The mechanical boundaries fire: a planted violation of each is caught.

Each test copies the project's code into a temporary folder, plants one
violation, and runs the same checker that `make test` runs on the real tree.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PACKAGES = ("clock", "config", "delivery", "intake", "loopback", "reminders", "workshops")


@pytest.fixture
def tree(tmp_path):
    for package in PACKAGES:
        if (ROOT / package).exists():
            shutil.copytree(
                ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
            )
    for name in (".importlinter", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tree, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _ruff(tree: Path, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ruff"), "check", "--no-cache", "--select", "TID251", path],
        cwd=tree, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_clean_tree_keeps_every_contract(tree):
    result = _lint_imports(tree)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("path", "line", "contract"),
    [
        ("workshops/planted.py", "import reminders.models\n", "Workshops never import reminders"),
        (
            "workshops/models.py",
            "import celery  # planted\n",
            "Models import neither Celery nor asyncio nor delivery code",
        ),
        (
            "reminders/models.py",
            "import asyncio  # planted\n",
            "Models import neither Celery nor asyncio nor delivery code",
        ),
        (
            "delivery/planted.py",
            "import django.db  # planted\n",
            "Delivery never touches Django, Celery or the apps",
        ),
        (
            "reminders/worker/pipeline.py",
            "import reminders.selectors  # planted\n",
            "The send path never reads the staff selectors",
        ),
        # The old circle: services -> publish -> tasks -> pipeline -> services.
        (
            "reminders/services/dispatch.py",
            "import reminders.worker.pipeline  # planted\n",
            "The services never import the worker, the admin or the tasks",
        ),
        (
            "reminders/admin/reminder.py",
            "import reminders.tasks  # planted\n",
            "Nothing imports the task modules",
        ),
        (
            "reminders/queue.py",
            "import reminders.services  # planted\n",
            "The queue imports no config, no tasks, no services",
        ),
        (
            "reminders/worker/bridge.py",
            "import reminders.services._sql  # planted\n",
            "Nothing outside the services uses their SQL",
        ),
        (
            "reminders/models.py",
            "import reminders.content  # planted\n",
            "Reminders in layers: entry points, flows, services, what they share",
        ),
        (
            "reminders/services/claim.py",
            "import celery  # planted\n",
            "Only the queue, the tasks and the worker speak to Celery",
        ),
    ],
)
def test_planted_import_breaks_its_contract(tree, path, line, contract):
    target = tree / path
    if not target.parent.exists():
        pytest.fail(f"{target.parent.name}/ is missing from the project")
    target.write_text(line + (target.read_text() if target.exists() else ""))
    result = _lint_imports(tree)
    assert result.returncode == 1
    assert f"{contract} BROKEN" in result.stdout


@pytest.mark.parametrize(
    "call",
    [
        "from datetime import datetime\nx = datetime.now()\n",
        "from django.utils import timezone\nx = timezone.now()\n",
        "import time\nx = time.monotonic()\n",
        "import time\ntime.sleep(1)\n",
        "import time\nx = time.time()\n",
    ],
)
def test_reading_time_outside_the_clock_module_is_banned(tree, call):
    (tree / "reminders" / "planted.py").write_text(call)
    result = _ruff(tree, "reminders/planted.py")
    assert result.returncode == 1
    assert "TID251" in result.stdout


def test_the_clock_module_may_read_time(tree):
    result = _ruff(tree, "clock/__init__.py")
    assert result.returncode == 0, result.stdout
