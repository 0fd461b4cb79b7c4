"""Approvals over HTTP (issue 29): `GET /approvals` and `POST /turns/{id}/approvals` of the gateway app,
run in this process (Starlette's test client over the real app) with the in-process worker, the real
Postgres and Redis and the model stub. Tenant-scoped as every endpoint is: another tenant's paused
turn is neither listed nor decidable, and answers exactly as a turn that does not exist."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from chatq.gateway_variables import TenantToken
from chatq.settings import get_settings
from tests.integration.approvals.conftest import APPROVED
from tests.support.effects import EFFECT, lines
from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import wait_for_status, wait_for_turn
from worker.gateway.app import create_app
from worker.gateway.config import GatewaySettings
from worker.runtime.recovery.sweeper import time_out_approvals

SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"
TOKENS = {ACME: "acme-" + secrets.token_hex(16), GLOBEX: "globex-" + secrets.token_hex(16)}


@pytest.fixture
def gateway(chatq_env: dict[str, str]) -> Iterator[TestClient]:
    """The gateway app in this process, with two tenants' tokens."""
    settings = GatewaySettings(tenant_tokens=tuple(TenantToken(tenant=t, token=k) for t, k in TOKENS.items()))
    with TestClient(create_app(settings, chatq=get_settings()), base_url="http://localhost") as client:
        yield client


def _as(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and "\n" not in body["error"]
    message: str = body["error"]
    return message


def _pause(client: TestClient, path: Path, **metadata: Any) -> tuple[str, str]:
    """A session of ACME's whose turn calls `effect_approved` once, paused: (turn id, call id)."""
    session = client.post(
        "/sessions",
        json={"framework": "plain_openai", "model": "gpt-4o-mini", "metadata": {"tools": [APPROVED], **metadata}},
        headers=_as(ACME),
    )
    assert session.status_code == 201, session.text
    content = f'approve-{uuid.uuid4().hex} [rounds: 1 {APPROVED} {{"path": "{path}"}}]'
    submitted = client.post(
        f"/sessions/{session.json()['session_id']}/turns", json={"content": content}, headers=_as(ACME)
    )
    assert submitted.status_code == 202, submitted.text
    turn_id = submitted.json()["turn_id"]
    wait_for_status(uuid.UUID(turn_id), "awaiting_approval")
    [waiting] = [p for p in client.get("/approvals", headers=_as(ACME)).json()["approvals"] if p["turn_id"] == turn_id]
    [call] = waiting["calls"]
    return turn_id, call["id"]


def _paused_count() -> float:
    return REGISTRY.get_sample_value("chatq_turns_paused_total", {"framework": "plain_openai"}) or 0.0


def _waits(outcome: str) -> tuple[float, float]:
    """(count, sum) of the approval wait histogram for `outcome`."""
    labels = {"outcome": outcome}
    count = REGISTRY.get_sample_value("chatq_approval_wait_seconds_count", labels) or 0.0
    return count, REGISTRY.get_sample_value("chatq_approval_wait_seconds_sum", labels) or 0.0


def test_a_paused_turn_is_listed_for_its_tenant_only_and_an_approval_resumes_it(
    gateway: TestClient, in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    paused_before, (waits_before, waited_before) = _paused_count(), _waits("approved")
    turn_id, call_id = _pause(gateway, out)
    assert _paused_count() == paused_before + 1  # the `paused` hook's counter
    time.sleep(0.5)  # the person thinks
    [listed] = [p for p in gateway.get("/approvals", headers=_as(ACME)).json()["approvals"] if p["turn_id"] == turn_id]
    assert listed["calls"] == [{"id": call_id, "name": APPROVED, "args": {"path": str(out)}}]
    assert listed["until"] > time.time() + 3600
    assert turn_id not in {p["turn_id"] for p in gateway.get("/approvals", headers=_as(GLOBEX)).json()["approvals"]}
    assert gateway.get(f"/turns/{turn_id}", headers=_as(ACME)).json()["status"] == "awaiting_approval"

    # Another tenant's turn answers exactly as one that does not exist, and nothing is decided.
    nowhere = str(uuid.uuid4())
    foreign = gateway.post(f"/turns/{turn_id}/approvals", json={"approve": True}, headers=_as(GLOBEX))
    missing = gateway.post(f"/turns/{nowhere}/approvals", json={"approve": True}, headers=_as(GLOBEX))
    assert _error(foreign, 404) == _error(missing, 404).replace(nowhere, turn_id)
    named = gateway.post(f"/turns/{turn_id}/approvals", json={"approve": True, "call_id": call_id}, headers=_as(GLOBEX))
    _error(named, 404)
    assert "missing bearer token" in _error(gateway.post(f"/turns/{turn_id}/approvals", json={"approve": True}), 401)
    assert "missing bearer token" in _error(gateway.get("/approvals"), 401)
    assert lines(out) == []

    approved = gateway.post(f"/turns/{turn_id}/approvals", json={"approve": True}, headers=_as(ACME))
    assert approved.status_code == 200, approved.text
    assert approved.json() == {"turn_id": turn_id, "calls": [call_id], "approved": True, "resumed": True}
    assert wait_for_turn(uuid.UUID(turn_id)).status.value == "succeeded"
    assert lines(out) == [f"{turn_id}:{call_id}"]
    # The resumed attempt reported the call's wait, pause to decision, once.
    waits, waited = _waits("approved")
    assert waits == waits_before + 1 and 0.5 <= waited - waited_before < 30
    assert turn_id not in {p["turn_id"] for p in gateway.get("/approvals", headers=_as(ACME)).json()["approvals"]}

    # A second decision, on the call or on the turn, is a conflict; the call ran once.
    again = gateway.post(
        f"/turns/{turn_id}/approvals", json={"call_id": call_id, "approve": False, "reason": "no"}, headers=_as(ACME)
    )
    assert "not awaiting approval" in _error(again, 409)
    assert "not awaiting approval" in _error(
        gateway.post(f"/turns/{turn_id}/approvals", json={"approve": True}, headers=_as(ACME)), 409
    )
    assert lines(out) == [f"{turn_id}:{call_id}"]


def test_bad_decisions_are_422_in_one_line_and_a_denial_reaches_the_model(
    gateway: TestClient, in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    turn_id, call_id = _pause(gateway, out)
    path = f"/turns/{turn_id}/approvals"

    def refused(body: dict[str, Any]) -> str:
        return _error(gateway.post(path, json=body, headers=_as(ACME)), 422)

    assert "approve is required" in refused({"call_id": call_id})
    assert "approve must be true or false" in refused({"approve": "yes"})
    assert "args must be a JSON object" in refused({"approve": True, "args": [1]})
    assert "args must be a JSON object, and only with approve" in refused({"approve": False, "args": {}})
    assert "unknown field(s): colour" in refused({"approve": True, "colour": "red"})
    assert "argument 'path' must be string" in refused({"call_id": call_id, "approve": True, "args": {"path": 3}})
    assert "unknown argument 'nope'" in refused({"approve": True, "args": {"path": "x", "nope": 1}})
    assert "no call 'nope'" in _error(
        gateway.post(path, json={"call_id": "nope", "approve": True}, headers=_as(ACME)), 409
    )
    denied = gateway.post(path, json={"call_id": call_id, "approve": False, "reason": "not today"}, headers=_as(ACME))
    assert denied.status_code == 200 and denied.json()["resumed"] is True
    assert wait_for_turn(uuid.UUID(turn_id)).status.value == "succeeded"
    assert lines(out) == []
    [result] = [
        r["messages"][-1]
        for r in openai_stub.requests
        if r.get("messages") and r["messages"][-1].get("tool_call_id") == call_id
    ]
    assert "denied" in result["content"] and "not today" in result["content"]


def test_past_the_deadline_a_decision_is_410(
    gateway: TestClient, in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    timed_out_before = _waits("timed_out")[0]
    turn_id, call_id = _pause(gateway, out, approval_timeout=0.5)
    time.sleep(0.8)
    path = f"/turns/{turn_id}/approvals"
    assert "deadline" in _error(gateway.post(path, json={"approve": True}, headers=_as(ACME)), 410)
    assert time_out_approvals(build_runtime()) == 1
    assert wait_for_turn(uuid.UUID(turn_id)).status.value == "succeeded"
    named = gateway.post(path, json={"call_id": call_id, "approve": True}, headers=_as(ACME))
    assert "deadline" in _error(named, 410)
    assert lines(out) == []
    assert _waits("timed_out")[0] == timed_out_before + 1


def test_the_session_api_takes_an_approval_policy_checked_as_the_python_api_checks_it(
    gateway: TestClient, in_process: InProcessWorker, openai_stub: OpenAIStub, tmp_path: Path
) -> None:
    bad = gateway.post("/sessions", json={"approval": "sometimes"}, headers=_as(ACME))
    assert "approval must be none, paid, all or a list of tool names" in _error(bad, 422)
    created = gateway.post(
        "/sessions",
        json={"framework": "plain_openai", "model": "gpt-4o-mini", "metadata": {"tools": [EFFECT]}, "approval": "none"},
        headers=_as(ACME),
    )
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    assert "approval must be" in _error(
        gateway.patch(f"/sessions/{session_id}", json={"approval": 3}, headers=_as(ACME)), 422
    )
    changed = gateway.patch(f"/sessions/{session_id}", json={"approval": [EFFECT]}, headers=_as(ACME))
    assert changed.status_code == 200 and changed.json()["metadata"] == {"tools": [EFFECT], "approval": [EFFECT]}
    out = tmp_path / "out.txt"
    submitted = gateway.post(
        f"/sessions/{session_id}/turns",
        json={"content": f'go [rounds: 1 {EFFECT} {{"path": "{out}"}}]'},
        headers=_as(ACME),
    )
    turn_id = submitted.json()["turn_id"]
    wait_for_status(uuid.UUID(turn_id), "awaiting_approval")
    decided = gateway.post(f"/turns/{turn_id}/approvals", json={"approve": True}, headers=_as(ACME))
    assert decided.status_code == 200 and decided.json()["resumed"] is True
    assert wait_for_turn(uuid.UUID(turn_id)).status.value == "succeeded"
    assert len(lines(out)) == 1
