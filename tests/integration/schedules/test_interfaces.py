"""`chatq schedule ...` in this process, and the HTTP endpoints on the real gateway app (tenant
isolation across every endpoint is walked by tests/integration/tenants/test_tenant_walk.py)."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import httpx
import pytest
import uvicorn

from chatq.gateway_variables import TenantToken
from chatq.settings import get_settings
from tests.integration.schedules.conftest import fire
from worker.cli.commands import main
from worker.gateway.app import create_app
from worker.gateway.config import GatewaySettings
from worker.gateway.server import GatewayServer
from worker.producer import create_session

TOKENS = {"acme": "acme-" + secrets.token_hex(16), "globex": "globex-" + secrets.token_hex(16)}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`chatq ARGS...` in this process: exit code, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_round_trip(capsys: pytest.CaptureFixture[str]) -> None:
    session_id = str(create_session(framework="none", model="echo"))
    code, out, err = run(capsys, "schedule", "add", "--session", session_id, "--every", "30", "--json", "report")
    assert code == 0, err
    schedule = json.loads(out)
    assert (schedule["session_id"], schedule["every"], schedule["overlap"]) == (session_id, 30.0, "skip")
    created = datetime.fromisoformat(schedule["created_at"])
    assert fire(created + timedelta(seconds=30)) == 1
    code, out, err = run(capsys, "schedule", "show", schedule["id"])
    assert code == 0, err
    assert "next " in out and "runs 1" in out and "queued" in out, out
    code, out, err = run(
        capsys, "schedule", "update", schedule["id"], "--cron", "0 9 * * 1", "--timezone", "Europe/Berlin", "--json"
    )
    assert code == 0, err
    assert (json.loads(out)["cron"], json.loads(out)["every"]) == ("0 9 * * 1", None)
    assert run(capsys, "schedule", "pause", schedule["id"])[0] == 0
    code, out, _ = run(capsys, "schedule", "list")
    assert schedule["id"] in out and "paused" in out
    assert run(capsys, "schedule", "resume", schedule["id"])[0] == 0
    assert run(capsys, "schedule", "delete", schedule["id"])[0] == 0
    code, _, err = run(capsys, "schedule", "show", schedule["id"])
    assert code == 1 and err.count("\n") == 1 and "does not exist" in err
    code, _, err = run(capsys, "schedule", "add", "--cron", "not cron", "x")
    assert code == 1 and "bad cron expression" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def base_url(chatq_env: dict[str, str]) -> Iterator[str]:
    settings = GatewaySettings(
        tokens=("admin-" + secrets.token_hex(16),),
        tenant_tokens=tuple(TenantToken(tenant=t, token=token) for t, token in TOKENS.items()),
    )
    app = create_app(settings, chatq=get_settings())
    server = GatewayServer(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"), app.state.gateway)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process gateway did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    server.should_exit = True
    thread.join(30)


def test_http_endpoints_scoped_by_tenant(base_url: str) -> None:
    acme = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKENS['acme']}"}, timeout=30)
    globex = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKENS['globex']}"}, timeout=30)
    with acme, globex:
        body = {"session_template": {"framework": "none"}, "content": "x", "cron": "*/5 * * * *", "timezone": "UTC"}
        created = acme.post("/schedules", json=body)
        assert created.status_code == 201, created.text
        schedule = created.json()
        assert schedule["tenant"] == "acme" and created.headers["location"] == f"/schedules/{schedule['id']}"
        assert datetime.fromisoformat(schedule["next_run_at"]).minute % 5 == 0
        assert [s["id"] for s in acme.get("/schedules").json()["schedules"]] == [schedule["id"]]
        assert globex.get("/schedules").json()["schedules"] == []
        assert globex.get(f"/schedules/{schedule['id']}").status_code == 404
        changed = acme.patch(f"/schedules/{schedule['id']}", json={"every": 60, "cron": None})
        assert changed.status_code == 200, changed.text
        assert (changed.json()["every"], changed.json()["cron"]) == (60.0, None)
        assert acme.post(f"/schedules/{schedule['id']}/pause").json()["enabled"] is False
        assert acme.post(f"/schedules/{schedule['id']}/resume").json()["enabled"] is True
        shown = acme.get(f"/schedules/{schedule['id']}").json()
        assert shown["last_runs"] == [] and shown["next_run_at"] is not None
        bad = acme.post("/schedules", json={**body, "timezone": "Nowhere/Else"})
        assert bad.status_code == 422 and "unknown time zone" in bad.json()["error"]
        assert acme.get("/schedules").json()["schedules"][0]["id"] == schedule["id"]
        assert acme.delete(f"/schedules/{schedule['id']}").status_code == 200
        assert acme.get(f"/schedules/{schedule['id']}").status_code == 404
