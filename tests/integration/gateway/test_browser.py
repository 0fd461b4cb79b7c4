"""The chat page in a real browser: headless Debian Chromium driven by Playwright, against the real stack.

`scripts/browser.sh` installs Chromium (`apt-get install chromium`); where /usr/bin/chromium does
not exist these tests are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.gateway.conftest import STUB_MODEL, TOKEN, GatewayProcess
from tests.support.openai_stub import OpenAIStub

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("worker")]

CHROMIUM = "/usr/bin/chromium"
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

# Records every state a tool chip and the reply pass through, so the test sees "started" even
# when "finished" follows a millisecond later.
RECORDER = """
window.__seen = {tools: [], states: [], partial: []};
new MutationObserver((records) => {
  for (const record of records) {
    const node = record.target;
    if (!(node instanceof Element)) continue;
    if (node.matches("li[data-tool-id]")) window.__seen.tools.push(node.textContent + ":" + node.dataset.status);
    if (node.matches(".msg.assistant")) window.__seen.states.push(node.dataset.state);
  }
  const reply = document.querySelector(".msg.assistant:last-of-type");
  if (reply && reply.dataset.state === "streaming") {
    window.__seen.partial.push(reply.querySelector(".text").textContent);
  }
}).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true,
  attributeFilter: ["data-status", "data-state"]});
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} does not exist: run scripts/browser.sh (installs Debian's chromium) to run these")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    def on_console(message: Any) -> None:
        # Chromium logs every non-2xx fetch as "Failed to load resource"; the tests provoke some on purpose.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(message.text)

    page.on("console", on_console)
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()
    assert not errors, errors


def open_chat(page: Any, gateway: GatewayProcess, model: str) -> None:
    page.goto(f"{gateway.base_url}/?model={model}#token={TOKEN}")
    assert "#" not in page.url, "the token stays in the address bar"
    assert page.input_value("#model") == model
    page.evaluate(RECORDER)


def send(page: Any, text: str) -> Any:
    """Type a message, press Enter, and return the reply's element."""
    replies = page.locator(".msg.assistant").count()
    page.fill("#input", text)
    page.press("#input", "Enter")
    reply = page.locator(".msg.assistant").nth(replies)
    reply.wait_for()
    return reply


def test_the_page_creates_a_session_and_renders_the_reply_as_it_streams(page: Any, gateway: GatewayProcess) -> None:
    open_chat(page, gateway, STUB_MODEL)
    reply = send(page, "count [words: 25] [slow: 0.08]")
    page.wait_for_selector(".msg.assistant[data-state=streaming] .text:not(:empty)")
    partial = reply.locator(".text").text_content()
    page.wait_for_selector(".msg.assistant[data-state=done]")
    expected = " ".join(f"w{i}" for i in range(1, 26))
    assert reply.locator(".text").text_content() == expected
    assert partial and expected.startswith(partial) and partial != expected
    seen = page.evaluate("window.__seen")
    assert len(set(seen["partial"])) > 5, "the reply arrived in one piece, not streamed"
    assert seen["states"][-1] == "done"
    assert "completion tokens" in (reply.locator(".meta").text_content() or "")
    assert page.locator(".msg.user").text_content() == "count [words: 25] [slow: 0.08]"
    session_text = page.text_content("#session-id") or ""
    assert session_text.startswith("session ")
    assert page.is_enabled("#send")

    # The next message goes to the same session, with the first turn as history.
    second = send(page, "again")
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-state=done]")
    assert second.locator(".text").text_content() == "You said: again"
    assert page.text_content("#session-id") == session_text


def test_the_page_shows_tool_calls_as_they_start_and_finish(page: Any, gateway: GatewayProcess) -> None:
    open_chat(page, gateway, STUB_MODEL)
    reply = send(page, "six times seven [calc: 6*7]")
    page.wait_for_selector(".msg.assistant[data-state=done]")
    assert reply.locator(".text").text_content() == "The answer is 42."
    chip = reply.locator("li[data-tool-id]")
    assert chip.count() == 1
    assert chip.text_content() == "calculator" and chip.get_attribute("data-status") == "finished"
    seen = page.evaluate("window.__seen")["tools"]
    assert seen[:2] == ["calculator:started", "calculator:finished"]


def test_the_page_works_with_the_offline_echo_model(page: Any, gateway: GatewayProcess) -> None:
    open_chat(page, gateway, "echo")
    reply = send(page, "hello from a real browser")
    page.wait_for_selector(".msg.assistant[data-state=done]")
    assert reply.locator(".text").text_content() == "hello from a real browser"


def test_the_page_shows_retries_and_errors(page: Any, gateway: GatewayProcess) -> None:
    open_chat(page, gateway, STUB_MODEL)
    reply = send(page, "doomed [fail]")
    page.wait_for_selector(".msg.assistant[data-state=error]")
    assert "retrying" in (reply.locator(".note").first.text_content() or "")
    assert reply.locator(".text").text_content()
    assert reply.locator(".meta").text_content() == "failed"
    assert page.is_enabled("#send")


def test_stop_ends_a_turn_whose_model_sends_nothing_and_the_next_one_runs(
    page: Any, gateway: GatewayProcess, openai_stub: OpenAIStub
) -> None:
    open_chat(page, gateway, STUB_MODEL)
    marker = uuid.uuid4().hex
    reply = send(page, f"think it over {marker} [sleep: 60]")
    deadline = time.monotonic() + 20
    while not any(marker in json.dumps(body) for body in openai_stub.requests):
        assert time.monotonic() < deadline, "the model never got the request"
        time.sleep(0.05)
    page.wait_for_selector("#stop:enabled")
    clicked = time.monotonic()
    page.click("#stop")
    page.wait_for_selector(".msg.assistant[data-state=cancelled]")
    stopped = time.monotonic() - clicked
    print(f"\nthe page's Stop ended a silent turn after {stopped:.2f}s (the model would have slept 60 s)")
    # Well inside the workers' 20 s turn timeout, let alone the model's minute of silence.
    assert stopped < 10
    assert reply.locator(".meta").text_content() == "cancelled"
    after = send(page, "and now? [words: 2]")
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-state=done]")
    assert after.locator(".text").text_content() == "w1 w2"


def test_the_page_reports_api_errors(page: Any, gateway: GatewayProcess) -> None:
    page.goto(f"{gateway.base_url}/?model={STUB_MODEL}#token=wrong-{TOKEN}")
    reply = send(page, "hello")
    page.wait_for_selector(".msg.assistant[data-state=error]")
    assert "wrong bearer token" in (reply.locator(".text").text_content() or "")
    assert "wrong bearer token" in (page.text_content("#status") or "")


@pytest.mark.parametrize("refuse_first_reconnect", [False, True], ids=["eventsource-retry", "page-reopens"])
def test_the_page_resumes_a_reply_after_the_gateway_dies_with_nothing_lost_or_repeated(
    page: Any, gateway_env: dict[str, str], refuse_first_reconnect: bool
) -> None:
    """EventSource reconnects with Last-Event-ID; if the gateway answers an error instead (which makes
    EventSource give up), the page opens a new stream with ?last_event_id= itself."""
    requests: list[str] = []

    def route(route: Any) -> None:
        requests.append(route.request.url)
        if refuse_first_reconnect and len(requests) == 2:
            route.fulfill(status=503, content_type="application/json", body='{"error": "Redis is restarting"}')
        else:
            route.continue_()

    page.route("**/turns/*/events*", route)
    first = GatewayProcess(gateway_env).wait_ready()
    second: GatewayProcess | None = None
    try:
        open_chat(page, first, STUB_MODEL)
        reply = send(page, "long [words: 60] [slow: 0.05]")
        deadline = time.monotonic() + 30
        while len((reply.locator(".text").text_content() or "").split()) < 5:  # mid-reply
            assert time.monotonic() < deadline, "the reply did not start"
            time.sleep(0.02)
        first.kill()
        second = GatewayProcess(gateway_env, port=first.port).wait_ready()
        page.wait_for_selector(".msg.assistant[data-state=done]", timeout=60_000)
        # Had the stream started over, the words before the crash would show twice; had it
        # skipped, some would be missing.
        assert reply.locator(".text").text_content() == " ".join(f"w{i}" for i in range(1, 61))
        assert re.search(r'GET /turns/\S+/events\?access_token=\*\*\*\S* HTTP/1.1" 200', second.log())
        if refuse_first_reconnect:
            assert len(requests) >= 3 and "last_event_id=" in requests[-1]
        else:
            assert all("last_event_id=" not in url for url in requests)
    finally:
        first.kill()
        if second is not None:
            second.stop()


# ------------------------------------------------------------------------- sessions and history


def _api_session(gateway: GatewayProcess, turns: list[str]) -> tuple[str, list[str]]:
    """A session with these turns, submitted over HTTP and waited for."""
    import httpx

    from tests.support.turns import wait_for_turn

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as client:
        session_id = client.post("/sessions", json={"model": STUB_MODEL}).json()["session_id"]
        turn_ids = [
            client.post(f"/sessions/{session_id}/turns", json={"content": content}).json()["turn_id"]
            for content in turns
        ]
    for turn_id in turn_ids:
        if "[slow:" not in turns[turn_ids.index(turn_id)]:
            wait_for_turn(uuid.UUID(turn_id))
    return session_id, turn_ids


def test_the_page_lists_sessions_and_reopening_one_shows_its_history(page: Any, gateway: GatewayProcess) -> None:
    older, _ = _api_session(gateway, ["first question", "six times seven [calc: 6*7]"])
    newer, _ = _api_session(gateway, ["in the newer session"])
    page.goto(f"{gateway.base_url}/#token={TOKEN}")
    page.wait_for_selector(f"#session-list button[data-session-id='{older}']")
    listed = page.eval_on_selector_all("#session-list button", "buttons => buttons.map(b => b.dataset.sessionId)")
    assert listed.index(newer) < listed.index(older), "newest first"
    page.click(f"#session-list button[data-session-id='{older}']")
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-state=done]")
    assert page.locator(".msg.user").all_text_contents() == ["first question", "six times seven [calc: 6*7]"]
    replies = page.locator(".msg.assistant .text").all_text_contents()
    assert replies == ["You said: first question", "The answer is 42."]
    chip = page.locator(".msg.assistant").nth(1).locator("li[data-tool-id]")
    assert chip.text_content() == "calculator" and chip.get_attribute("data-status") == "finished"
    assert page.text_content("#session-id") == f"session {older}"
    assert f"session={older}" in page.url
    assert page.get_attribute(f"#session-list button[data-session-id='{older}']", "aria-current") == "true"
    # The conversation goes on in the reopened session, with its history.
    reply = send(page, "and again")
    page.wait_for_selector(".msg.assistant:nth-of-type(6)[data-state=done]")
    assert reply.locator(".text").text_content() == "You said: and again"
    assert page.text_content("#session-id") == f"session {older}"


def test_reopening_a_session_mid_reply_shows_its_history_then_the_reply_live(
    page: Any, gateway: GatewayProcess
) -> None:
    session_id, turns = _api_session(gateway, ["hello", "long [words: 60] [slow: 0.05]"])
    from tests.support.turns import wait_for_status

    wait_for_status(uuid.UUID(turns[1]), "running")
    page.goto(f"{gateway.base_url}/?session={session_id}#token={TOKEN}")
    page.evaluate(RECORDER)
    first = page.locator(".msg.assistant").nth(0)
    first.wait_for()
    assert first.get_attribute("data-state") == "done"
    assert first.locator(".text").text_content() == "You said: hello"
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-state=streaming]")
    page.wait_for_selector(".msg.assistant:nth-of-type(4)[data-state=done]", timeout=60_000)
    live = page.locator(".msg.assistant").nth(1)
    # From its first event, then live: every word once, in order.
    assert live.locator(".text").text_content() == " ".join(f"w{i}" for i in range(1, 61))
    assert "streaming" in page.evaluate("window.__seen")["states"]
    assert page.is_enabled("#send")


def test_more_loads_older_sessions(page: Any, gateway: GatewayProcess) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as client:
        oldest = client.post("/sessions", json={}).json()["session_id"]
        for _ in range(20):
            client.post("/sessions", json={})
    page.goto(f"{gateway.base_url}/#token={TOKEN}")
    page.wait_for_selector("#session-list button")
    assert page.locator("#session-list button").count() == 20
    assert page.locator(f"#session-list button[data-session-id='{oldest}']").count() == 0
    page.click("#more-sessions")
    page.wait_for_selector(f"#session-list button[data-session-id='{oldest}']")
    assert page.locator("#session-list button").count() > 20


def test_the_page_asks_for_approval_of_a_waiting_call_and_approve_resumes_the_turn(
    page: Any, gateway: GatewayProcess
) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=gateway.base_url, headers=headers, timeout=30) as client:
        created = client.post("/sessions", json={"model": STUB_MODEL, "approval": "all"})
        session_id = created.json()["session_id"]
    page.goto(f"{gateway.base_url}/?session={session_id}#token={TOKEN}")
    page.evaluate(RECORDER)
    reply = send(page, "six times seven [calc: 6*7]")
    page.wait_for_selector(".msg.assistant[data-state=paused] .approval button")
    assert "calculator" in (reply.locator(".approval").text_content() or "")
    assert "waiting for approval" in (reply.locator(".meta").text_content() or "")
    reply.locator(".approval button", has_text="Approve").click()
    page.wait_for_selector(".msg.assistant[data-state=done]")
    assert reply.locator(".text").text_content() == "The answer is 42."
    assert "approved" in (reply.locator(".approval").text_content() or "")
    assert page.is_enabled("#send")
