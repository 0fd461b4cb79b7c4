"""The gateway's JSON endpoints against a real server, worker, Redis and Postgres: results and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.gateway.conftest import MAX_BODY, STUB_MODEL, TOKEN, GatewayProcess
from tests.support.turns import wait_for_status, wait_for_turn
from tests.support.workers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("worker")]


def new_session(api: httpx.Client, **fields: object) -> str:
    response = api.post("/sessions", json={"model": STUB_MODEL, **fields})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def error_of(response: httpx.Response, status: int) -> str:
    """The one-line error of a JSON error response with this status."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    message: str = body["error"]
    assert message and "\n" not in message and "Traceback" not in message
    return message


# ------------------------------------------------------------------------------- happy paths


def test_create_a_session_submit_a_turn_and_show_it_like_chatq_show_json(
    api: httpx.Client, gateway_env: dict[str, str]
) -> None:
    response = api.post("/sessions", json={"model": STUB_MODEL, "system_prompt": "Be brief.", "metadata": {"a": 1}})
    assert response.status_code == 201
    session_id = response.json()["session_id"]
    assert response.headers["location"] == f"/sessions/{session_id}"
    assert response.json()["links"]["events"] == f"/sessions/{session_id}/events"

    response = api.post(f"/sessions/{session_id}/turns", json={"content": "six times seven [calc: 6*7]"})
    assert response.status_code == 202
    submitted = response.json()
    turn_id = submitted["turn_id"]
    assert submitted["session_id"] == session_id and submitted["position"] == 0
    assert submitted["created"] is True and submitted["sent"] is True and submitted["cancelled"] == []
    assert submitted["links"] == {"turn": f"/turns/{turn_id}", "events": f"/turns/{turn_id}/events"}
    wait_for_turn(uuid.UUID(turn_id))

    shown = api.get(f"/turns/{turn_id}")
    assert shown.status_code == 200
    cli = subprocess.run(
        [sys.executable, "-m", "worker.cli", "show", turn_id, "--json"],
        cwd=ROOT,
        env={**os.environ, **gateway_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.json() == json.loads(cli.stdout)
    report = shown.json()
    assert report["status"] == "succeeded"
    assert [m["role"] for m in report["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert report["messages"][-1]["content"] == "The answer is 42."


def test_an_empty_body_creates_a_session_with_the_defaults(api: httpx.Client) -> None:
    response = api.post("/sessions")
    assert response.status_code == 201
    uuid.UUID(response.json()["session_id"])


def test_the_same_turn_id_is_idempotent_and_a_different_content_conflicts(api: httpx.Client) -> None:
    session_id = new_session(api)
    turn_id = str(uuid.uuid4())
    first = api.post(f"/sessions/{session_id}/turns", json={"content": "once [words: 2]", "turn_id": turn_id})
    assert first.status_code == 202 and first.json()["created"] is True
    again = api.post(f"/sessions/{session_id}/turns", json={"content": "once [words: 2]", "turn_id": turn_id})
    assert again.status_code == 200
    assert again.json()["created"] is False and again.json()["turn_id"] == turn_id
    other = api.post(f"/sessions/{session_id}/turns", json={"content": "something else", "turn_id": turn_id})
    assert "already exists" in error_of(other, 409)


def test_if_busy_reject_meets_a_busy_session_with_409_and_interrupt_cancels(api: httpx.Client) -> None:
    session_id = new_session(api)
    busy = api.post(f"/sessions/{session_id}/turns", json={"content": "thinking [words: 300] [slow: 0.05]"})
    assert busy.status_code == 202
    busy_id = busy.json()["turn_id"]
    wait_for_status(uuid.UUID(busy_id), "running")
    rejected = api.post(f"/sessions/{session_id}/turns", json={"content": "me too", "if_busy": "reject"})
    assert "busy" in error_of(rejected, 409)
    interrupt = api.post(f"/sessions/{session_id}/turns", json={"content": "instead", "if_busy": "interrupt"})
    assert interrupt.status_code == 202
    assert interrupt.json()["cancelled"] == [busy_id]
    assert wait_for_turn(uuid.UUID(busy_id)).status.value == "cancelled"
    assert wait_for_turn(uuid.UUID(interrupt.json()["turn_id"])).status.value == "succeeded"


def test_cancel_a_queued_turn_then_cancelling_a_finished_one_is_409(api: httpx.Client) -> None:
    session_id = new_session(api)
    busy = {"content": "hold on [words: 300] [slow: 0.05]"}
    first = api.post(f"/sessions/{session_id}/turns", json=busy).json()["turn_id"]
    queued = api.post(f"/sessions/{session_id}/turns", json={"content": "later"}).json()["turn_id"]
    response = api.post(f"/turns/{queued}/cancel")
    assert response.status_code == 200
    assert response.json() == {"turn_id": queued, "status": "cancelled", "already_cancelled": False}
    again = api.post(f"/turns/{queued}/cancel")
    assert again.status_code == 200
    assert again.json() == {"turn_id": queued, "status": "cancelled", "already_cancelled": True}
    stopping = api.post(f"/turns/{first}/cancel").json()
    assert stopping == {"turn_id": first, "status": "running", "already_cancelled": False}
    assert wait_for_turn(uuid.UUID(first)).status.value == "cancelled"
    assert api.post(f"/turns/{first}/cancel").json()["already_cancelled"] is True
    done = api.post(f"/sessions/{session_id}/turns", json={"content": "quick [words: 1]"}).json()["turn_id"]
    wait_for_turn(uuid.UUID(done))
    assert "already succeeded" in error_of(api.post(f"/turns/{done}/cancel"), 409)


def test_a_turn_paused_for_approval_is_listed_approved_over_http_and_resumes_on_the_real_worker(
    api: httpx.Client,
) -> None:
    session_id = new_session(api, approval="all")  # every tool call waits, the calculator's too
    turn_id = api.post(f"/sessions/{session_id}/turns", json={"content": "six times seven [calc: 6*7]"}).json()[
        "turn_id"
    ]
    wait_for_status(uuid.UUID(turn_id), "awaiting_approval")
    [waiting] = [p for p in api.get("/approvals").json()["approvals"] if p["turn_id"] == turn_id]
    [call] = waiting["calls"]
    assert waiting["session_id"] == session_id and call["args"]
    decided = api.post(f"/turns/{turn_id}/approvals", json={"call_id": call["id"], "approve": True})
    assert decided.json() == {"turn_id": turn_id, "calls": [call["id"]], "approved": True, "resumed": True}
    assert wait_for_turn(uuid.UUID(turn_id)).status.value == "succeeded"
    assert api.get(f"/turns/{turn_id}").json()["messages"][-1]["content"] == "The answer is 42."
    again = api.post(f"/turns/{turn_id}/approvals", json={"call_id": call["id"], "approve": True})
    assert "not awaiting approval" in error_of(again, 409)


# ---------------------------------------------------------------------------------- auth: 401


# Fixed, not random: every pytest process (make test runs several) must collect the same test ids.
SOME_ID = "3f1b0c7e-9d4a-4e51-8a5e-2c6f1d7b9e20"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/sessions"),
        ("POST", f"/sessions/{SOME_ID}/turns"),
        ("GET", f"/turns/{SOME_ID}"),
        ("POST", f"/turns/{SOME_ID}/cancel"),
        ("GET", f"/turns/{SOME_ID}/events"),
        ("GET", f"/sessions/{SOME_ID}/events"),
        ("GET", "/sessions"),
        ("GET", f"/sessions/{SOME_ID}"),
        ("PATCH", f"/sessions/{SOME_ID}"),
        ("DELETE", f"/sessions/{SOME_ID}"),
        ("GET", f"/sessions/{SOME_ID}/turns"),
        ("GET", "/approvals"),
        ("POST", f"/turns/{SOME_ID}/approvals"),
    ],
)
def test_every_api_endpoint_wants_the_token(anonymous: httpx.Client, method: str, path: str) -> None:
    missing = anonymous.request(method, path, json={"content": "x"})
    assert "missing bearer token" in error_of(missing, 401)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = anonymous.request(method, path, json={"content": "x"}, headers={"Authorization": f"Bearer {TOKEN}x"})
    assert "wrong bearer token" in error_of(wrong, 401)
    basic = anonymous.request(method, path, json={"content": "x"}, headers={"Authorization": f"Basic {TOKEN}"})
    error_of(basic, 401)


def test_the_page_the_health_check_and_the_openapi_document_are_public(anonymous: httpx.Client) -> None:
    page = anonymous.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "EventSource" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'sha256-" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    assert anonymous.get("/openapi.json").status_code == 200


def test_the_openapi_document_describes_every_endpoint(anonymous: httpx.Client) -> None:
    document = anonymous.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    expected = {
        "/sessions": {"post", "get"},
        "/sessions/{session_id}": {"get", "patch", "delete"},
        "/sessions/{session_id}/turns": {"post", "get"},
        "/sessions/{session_id}/events": {"get"},
        "/turns/{turn_id}": {"get"},
        "/turns/{turn_id}/cancel": {"post"},
        "/turns/{turn_id}/events": {"get"},
        "/turns/{turn_id}/approvals": {"post"},
        "/approvals": {"get"},
        "/schedules": {"get", "post"},
        "/schedules/{schedule_id}": {"get", "patch", "delete"},
        "/schedules/{schedule_id}/pause": {"post"},
        "/schedules/{schedule_id}/resume": {"post"},
        "/healthz": {"get"},
        "/readyz": {"get"},
    }
    assert {path: set(ops) for path, ops in document["paths"].items()} == expected
    for path, operations in document["paths"].items():
        for operation in operations.values():
            assert operation["summary"], path
            assert {"200", "201", "202"} & set(operation["responses"]), path
    refs: list[str] = []

    def collect(node: object) -> None:
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref" and isinstance(v, str))
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(document)
    assert refs
    for ref in refs:  # every reference resolves
        node = document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
    events = document["paths"]["/turns/{turn_id}/events"]["get"]
    assert {"bearer": []} in events["security"] and {"accessToken": []} in events["security"]
    assert "text/event-stream" in document["components"]["responses"]["EventStream"]["content"]


# --------------------------------------------------------------------------------- 404 and 405


def test_unknown_ids_are_404(api: httpx.Client) -> None:
    assert "does not exist" in error_of(api.get(f"/turns/{uuid.uuid4()}"), 404)
    assert "not a UUID" in error_of(api.get("/turns/not-a-uuid"), 404)
    response = api.post(f"/sessions/{uuid.uuid4()}/turns", json={"content": "hello"})
    assert "does not exist" in error_of(response, 404)
    assert "not a UUID" in error_of(api.post("/sessions/nope/turns", json={"content": "hi"}), 404)
    error_of(api.post(f"/turns/{uuid.uuid4()}/cancel"), 404)
    error_of(api.get("/no/such/route"), 404)
    error_of(api.delete("/sessions"), 405)


# ------------------------------------------------------------------------------------- 413


def test_bodies_over_the_limit_are_413_with_or_without_content_length(api: httpx.Client) -> None:
    session_id = new_session(api)
    big = json.dumps({"content": "x" * (MAX_BODY + 10)}).encode()
    declared = api.post(f"/sessions/{session_id}/turns", content=big, headers={"Content-Type": "application/json"})
    assert "CHATQ_API_MAX_BODY_BYTES" in error_of(declared, 413)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    chunked = api.post(f"/sessions/{session_id}/turns", content=chunks(), headers={"Content-Type": "application/json"})
    assert "CHATQ_API_MAX_BODY_BYTES" in error_of(chunked, 413)
    just_fits = api.post(f"/sessions/{session_id}/turns", json={"content": "y" * (MAX_BODY - 100)})
    assert just_fits.status_code == 202


# ------------------------------------------------------------------------------------- 422


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, "content is required"),
        ({"content": 7}, "content must be a string"),
        ({"content": ""}, "content"),
        ({"content": "hi", "if_busy": "sometimes"}, "if_busy"),
        ({"content": "hi", "images": "http://x/y.png"}, "images must be a list"),
        ({"content": "hi", "images": ["ftp://x/y.png"]}, "images[0]"),
        ({"content": "hi", "reply_to": -1}, "reply_to"),
        ({"content": "hi", "turn_id": "not-a-uuid"}, "turn_id"),
        ({"content": "hi", "colour": "blue"}, "unknown field(s): colour"),
    ],
)
def test_bad_turns_are_422_with_one_clear_line(api: httpx.Client, body: dict[str, object], fragment: str) -> None:
    session_id = new_session(api)
    assert fragment in error_of(api.post(f"/sessions/{session_id}/turns", json=body), 422)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"framework": "crewai"}, "unknown agent framework"),
        ({"framework": 3}, "framework must be a string"),
        ({"model": ["gpt"]}, "model must be a string"),
        ({"metadata": "x"}, "metadata must be an object"),
        ({"modle": "gpt-4o-mini"}, "unknown field(s): modle"),
    ],
)
def test_bad_sessions_are_422(api: httpx.Client, body: dict[str, object], fragment: str) -> None:
    assert fragment in error_of(api.post("/sessions", json=body), 422)


def _raw(api: httpx.Client, path: str, body: str) -> httpx.Response:
    """POST a JSON text as written (escapes such as \\ud800 kept: httpx would refuse to encode them)."""
    return api.post(path, content=body.encode("ascii"), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"content": "a\\ud800b"}', "content contains a lone surrogate (U+D800) at position 1"),
        ('{"content": "a\\u0000b"}', "content contains a NUL character (U+0000) at position 1"),
        ('{"content": "hi", "reply_to": 9223372036854775808}', "reply_to must be a message id from 1 to"),
        ('{"content": "hi", "reply_to": 1e400}', "reply_to must be a message id"),
        ('{"content": "hi", "images": ["https://x.test/\\u0000.png"]}', "images[0] contains a NUL character"),
        ('{"content": "hi", "\\udfff": 1}', "unknown field(s): '\\udfff'"),
    ],
)
def test_turn_fields_postgres_cannot_store_are_422_naming_the_field(
    api: httpx.Client, body: str, fragment: str
) -> None:
    session_id = new_session(api)
    assert fragment in error_of(_raw(api, f"/sessions/{session_id}/turns", body), 422)


def test_base64_image_data_is_checked_to_its_end(api: httpx.Client) -> None:
    session_id = new_session(api)
    data = "A" * 8000
    image = "data:image/png;base64," + data[:6000] + "!" + data[6001:]
    response = api.post(f"/sessions/{session_id}/turns", json={"content": "hi", "images": [image]})
    assert "images[0] is not valid base64" in error_of(response, 422)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"model": "gpt\\u0000"}', "model contains a NUL character"),
        ('{"model": "gpt\\udc80"}', "model contains a lone surrogate (U+DC80)"),
        ('{"system_prompt": "be \\ud83d brief"}', "system_prompt contains a lone surrogate (U+D83D)"),
        ('{"metadata": {"k": "\\u0000"}}', "metadata has a NUL character (U+0000) at position 0 in the value at k"),
        ('{"metadata": {"\\ud800": 1}}', "metadata has a lone surrogate (U+D800) at position 0 in a key"),
        ('{"metadata": {"n": NaN}}', "metadata has nan at n"),
        ('{"metadata": {"a": ' + "[" * 100 + "]" * 100 + "}}", "metadata is nested deeper than 32 levels"),
        ('{"metadata": ' + "[" * 30_000 + "]" * 30_000 + "}", "request body is nested too deeply"),
    ],
)
def test_session_fields_postgres_cannot_store_are_422_naming_the_field(
    api: httpx.Client, body: str, fragment: str
) -> None:
    assert fragment in error_of(_raw(api, "/sessions", body), 422)


def test_malformed_json_is_422_and_other_media_types_are_415(api: httpx.Client) -> None:
    headers = {"Content-Type": "application/json"}
    assert "not valid JSON" in error_of(api.post("/sessions", content=b"{nope", headers=headers), 422)
    assert "JSON object" in error_of(api.post("/sessions", content=b"[1, 2]", headers=headers), 422)
    assert "not valid JSON" in error_of(api.post("/sessions", content=b"\xff\xfe", headers=headers), 422)
    form = api.post("/sessions", content=b"content=hi", headers={"Content-Type": "text/plain"})
    assert "Content-Type: application/json" in error_of(form, 415)


def test_the_gateway_log_has_no_tracebacks(gateway: GatewayProcess) -> None:
    assert "Traceback" not in gateway.log()
