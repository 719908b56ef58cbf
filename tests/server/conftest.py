"""A real headless Chromium (Debian's `chromium`, driven by Playwright) for the pages' browser tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

# The playground tests' page helpers (playground_page.py) import by their own name, as tests/helpers.py does.
sys.path.insert(0, str(Path(__file__).parent))

CHROMIUM = Path("/usr/bin/chromium")
# Flags that keep Chromium offline and quiet in a sandbox-less CI container.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make install-browser` (apt-get install chromium)")
    with sync_playwright() as playwright:
        # Playwright gives the browser a fresh temporary --user-data-dir and never downloads one of its own here.
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()
