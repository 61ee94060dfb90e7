"""Fixtures for the loopback server tests (no database needed)."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clock import SystemClock
from loopback.http_sink import HttpSink
from loopback.smtp_sink import SmtpSink

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def http_sink() -> Iterator[HttpSink]:
    with HttpSink() as sink:
        yield sink


@pytest.fixture
def smtp_sink() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink


def start_server_process(*args: str, timeout: float = 10.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m <args>`` and return it with its first line ("... listening on ...")."""
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    clock = SystemClock()
    give_up_at = clock.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while clock.monotonic() < give_up_at:
            if selector.select(timeout=0.1):
                line = process.stdout.readline().strip()
                if line:
                    return process, line
            if process.poll() is not None:
                break
    process.kill()
    _, stderr = process.communicate(timeout=5)
    raise AssertionError(f"{' '.join(args)} did not start: {stderr}")


def stop_server_process(process: subprocess.Popen) -> int:
    """Send SIGTERM and return the exit code."""
    process.terminate()
    try:
        process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=5)
    return process.returncode
