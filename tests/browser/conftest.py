"""A real Chromium (Debian's /usr/bin/chromium) driven by Playwright, against the live server.

Playwright never downloads a browser here: the executable is given explicitly.
Install it with ``apt-get install -y chromium``.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RESULTS = Path(__file__).resolve().parents[2] / "test-results"
PASSWORD = "a-long-browser-test-password"
#: A phone's browser context: 375 x 667 CSS px at twice the pixels, touch.
PHONE = {"viewport": {"width": 375, "height": 667}, "device_scale_factor": 2, "is_mobile": True,
         "has_touch": True}  # fmt: skip


def log_in(page, base: str, username: str, next_path: str) -> None:
    """Log in through the admin's login form and wait for ``next_path``."""
    page.goto(f"{base}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(next_path) + "$"))


@pytest.fixture(autouse=True)
def plain_static_files(settings):
    """Serve admin assets without collectstatic's manifest (DEBUG is off in the tests)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def plain_http_cookies(settings):
    """The live server speaks plain HTTP: secure-only cookies would never come back."""
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False


@pytest.fixture(scope="module")
def chromium():
    """Launch Debian's Chromium for one test module.

    Not for the session: Playwright's sync API keeps an event loop running
    in this thread until it stops, and every later test calling
    ``asyncio.run`` would fail.
    """
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`.")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which
    # Django would take for async code and refuse the ORM calls of the test.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, timeout=30_000
    )
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise AssertionError("Playwright left an event loop running; asyncio.run() would now fail.")


@pytest.fixture
def new_page(chromium):
    """Return a factory of pages, each in its own browser context (its own cookies)."""
    contexts = []

    def make():
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(20_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def screenshot_dir() -> Path:
    RESULTS.mkdir(exist_ok=True)
    return RESULTS
