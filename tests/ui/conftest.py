"""A real browser for the web UI's tests: Debian's chromium driven by Playwright, screenshots
kept as test artifacts (and copied to $LLAMAQ_UI_SHOTS when set)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

Shot = Callable[[Page, str], Path]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Module-scoped: Playwright's sync API keeps an asyncio loop running in the main thread
    while it is started, which would stop every async test that comes after it."""
    executable = shutil.which("chromium")
    assert executable, "the web UI tests need chromium (scripts/install test installs it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable,
                                             args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser profile (empty localStorage) per test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(60_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(scope="session")
def shots_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ui-screenshots")


@pytest.fixture
def shot(shots_dir: Path) -> Shot:
    def take(page: Page, name: str) -> Path:
        path = shots_dir / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        copy_to = os.environ.get("LLAMAQ_UI_SHOTS")
        if copy_to:
            Path(copy_to).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(copy_to) / path.name)
        return path

    return take
