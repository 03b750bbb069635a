"""Browser test support: Playwright driving Debian's chromium, screenshots kept as artifacts.

``.ci/run`` installs chromium with apt-get (Playwright's own browser download is not reachable
here). Every page opened through :func:`open_page` fails its test on a console error or an
uncaught page error. Screenshots go to ``$GRADLAB_TEST_ARTIFACTS`` (default ``test-artifacts/``
in the repository root, ignored by git), where CI keeps them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("GRADLAB_CHROMIUM", "/usr/bin/chromium")
#: Flags for a closed network: without the background-networking ones chromium keeps dialling out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def artifacts_dir() -> Path:
    """The folder that keeps screenshots (created on first use)."""
    path = Path(os.environ.get("GRADLAB_TEST_ARTIFACTS", REPO / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_chromium() -> str:
    """The chromium executable; skips the test only outside CI when it is not installed."""
    exe = shutil.which(CHROMIUM) or (CHROMIUM if Path(CHROMIUM).is_file() else None)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is not installed: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    return exe


@contextmanager
def open_page(*, viewport: tuple[int, int] = (1400, 900)) -> Iterator[object]:
    """A fresh chromium page; raises AssertionError at exit if the page logged a console error.

    Yields:
        playwright.sync_api.Page. Its ``.console_errors`` list gathers error messages as they come.
    """
    from playwright.sync_api import sync_playwright

    exe = require_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            errors: list[str] = []
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
            page.console_errors = errors
            yield page
            assert not errors, f"console errors in the page: {errors}"
        finally:
            browser.close()


def screenshot(page: object, name: str) -> Path:
    """Save a full-page PNG screenshot as a test artifact; returns its path."""
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
