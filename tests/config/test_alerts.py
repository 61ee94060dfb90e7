"""deploy/prometheus: the rules load, fire as their unit tests say, and name only real series.

promtool comes from Debian's ``prometheus`` package (``apt-get install -y
prometheus``; .ci/run installs it). Its rule tests (alerts.test.yml) show
each alert firing on the series that should raise it and quiet on healthy
ones; the test below checks every series an expression reads against what
web's /metrics and a worker's port expose.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from reminders.worker.telemetry import WorkerObserver

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
TOKEN = "alerts-test-token-0a1b2c3d4e5f6a7b8c"
# What an expression may contain besides series names.
PROMQL_WORDS = {
    "time", "delta", "rate", "increase", "sum", "histogram_quantile", "absent", "and", "or", "unless",
    "by", "without", "on", "ignoring", "max", "scalar", "clamp_min", "label_replace",
}  # fmt: skip


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: install it with `apt-get install -y prometheus`.")
    return subprocess.run(
        [promtool, *args], cwd=RULES, capture_output=True, text=True, timeout=60, check=False
    )


def _rules() -> list[dict]:
    groups = yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules_and_the_example_config():
    rules = _promtool("check", "rules", "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = _promtool("check", "config", "--syntax-only", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_each_alert_fires_as_its_rule_test_says():
    result = _promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_rule_test():
    tested = set(re.findall(r"alertname: (\w+)", (RULES / "alerts.test.yml").read_text()))
    assert {rule["alert"] for rule in _rules()} <= tested


def series_names(expr: str) -> set[str]:
    """Return the series an expression reads (label matchers, groupings and strings removed)."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return words - PROMQL_WORDS


def _exposed(text: str) -> set[str]:
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


@pytest.mark.django_db
def test_every_series_the_rules_read_is_exposed(client, settings):
    from reminders.services.dispatch import scan_completed

    settings.METRICS_TOKEN = TOKEN
    # A scan that gave up a phase: its counts name it (reminders_scan_rows).
    scan_completed(counts={"planned": 0, "dispatch_skipped": 1}, duration=0.1)
    web = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert web.status_code == 200
    registry = CollectorRegistry()
    worker = WorkerObserver(registry=registry)
    worker.declare("http")
    worker.limiter_waited(0.01)
    exposed = _exposed(web.content.decode()) | _exposed(generate_latest(registry).decode())
    exposed.add("up")  # Prometheus's own, per target
    read = set().union(*(series_names(rule["expr"]) for rule in _rules()))
    assert read, "no series found in the rules"
    assert read <= exposed, sorted(read - exposed)


def test_the_series_parser_finds_names_and_skips_the_rest():
    expr = (
        "histogram_quantile(0.05, sum by (le, channel) "
        '(rate(reminders_send_slack_seconds_bucket{x="a b"}[30m]))) < 300'
    )
    assert series_names(expr) == {"reminders_send_slack_seconds_bucket"}


def test_operations_describes_every_alert():
    operations = (ROOT / "docs" / "operations.md").read_text()
    missing = [rule["alert"] for rule in _rules() if f"`{rule['alert']}`" not in operations]
    assert not missing, f"docs/operations.md does not describe {missing}"
