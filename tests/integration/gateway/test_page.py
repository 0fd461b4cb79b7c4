"""The chat page's own resources: its framework choices come from the registry, and it has an icon."""

from __future__ import annotations

import os
import re
from typing import Any

import httpx
import pytest

from handlers import FRAMEWORK_CHOICES
from tests.integration.gateway.conftest import TOKEN, GatewayProcess
from tests.integration.gateway.test_browser import CHROMIUM, CHROMIUM_ARGS


def _options(page: str) -> list[tuple[str, bool]]:
    select = re.search(r'<select id="framework">(.*?)</select>', page, re.DOTALL)
    assert select, "no framework <select> on the page"
    return [(m[1], bool(m[2])) for m in re.finditer(r'<option value="([^"]+)"( selected)?>', select[1])]


def test_the_framework_list_is_every_registered_framework(anonymous: httpx.Client) -> None:
    options = _options(anonymous.get("/").text)
    assert [value for value, _ in options] == [value for value, _ in FRAMEWORK_CHOICES]
    assert "plain_openai" in [value for value, _ in options]
    assert [value for value, selected in options if selected] == ["langgraph"], "the API's default is preselected"


@pytest.mark.parametrize("path", ["/favicon.ico", "/favicon.svg"])
def test_the_icon_is_served_without_a_token(anonymous: httpx.Client, path: str) -> None:
    response = anonymous.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("image/svg+xml")
    assert response.text.startswith("<svg")


def test_the_page_names_its_icon(anonymous: httpx.Client) -> None:
    assert '<link rel="icon" href="/favicon.svg"' in anonymous.get("/").text


@pytest.mark.slow
def test_in_a_browser_nothing_the_page_loads_fails(gateway: GatewayProcess) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} does not exist: run scripts/browser.sh (installs Debian's chromium) to run this")
    from playwright.sync_api import sync_playwright

    failed: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page: Any = browser.new_page()
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(f"{gateway.base_url}/#token={TOKEN}", wait_until="networkidle")
            values = page.eval_on_selector_all("#framework option", "options => options.map(o => o.value)")
            assert values == [value for value, _ in FRAMEWORK_CHOICES]
            assert page.input_value("#framework") == "langgraph"
            # The icon the page names loads (what a browser tab shows).
            assert page.evaluate("fetch('/favicon.svg').then(r => r.status)") == 200
        finally:
            browser.close()
    assert failed == []
