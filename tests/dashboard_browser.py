"""The browser side of the dashboard tests: Debian's Chromium driven by Playwright. A test
module launches one browser (``launch_browser``, in a module-scoped fixture) and gives each
test a fresh context, with no storage and no cookies (``new_page``)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api_node import ApiNode

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Skips a dashboard module, saying why, only where no Chromium is installed.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)"
)
TIMEOUT_MS = 30_000


@contextlib.contextmanager
def launch_browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield launched
        launched.close()


@contextlib.contextmanager
def new_page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    yield page
    context.close()


def sign_in(page: Any, api: ApiNode, key: tuple[str, str]) -> None:
    page.goto(api.url + "/dashboard/")
    page.fill("#key-id", key[0])
    page.fill("#secret", key[1])
    page.click("#login button[type=submit]")
