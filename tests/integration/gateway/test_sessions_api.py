"""Sessions over HTTP against a real gateway, worker, Redis and Postgres: lists, history, changes,
deletion, and scoped tenant tokens that cannot see or touch another tenant's sessions."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.gateway.conftest import STUB_MODEL, TOKEN, GatewayProcess
from tests.integration.gateway.test_api import error_of
from tests.support.broker import wait_for_drained_queues, wait_until
from tests.support.scan import redis_mentioning, tables_mentioning
from tests.support.turns import wait_for_status, wait_for_turn

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("worker")]

ACME = "acme-" + secrets.token_hex(16)
GLOBEX = "globex-" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def tenant_gateway(gateway_env: dict[str, str]) -> Iterator[GatewayProcess]:
    """A gateway with the admin token and two tenants' scoped tokens."""
    process = GatewayProcess({**gateway_env, "CHATQ_API_TOKENS": f"acme:{ACME},globex:{GLOBEX}"}).wait_ready()
    yield process
    process.stop()
    assert "Traceback" not in process.log()
    assert ACME not in process.log() and GLOBEX not in process.log()


def _client(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture
def admin(tenant_gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with _client(tenant_gateway, TOKEN) as client:
        yield client


@pytest.fixture
def acme(tenant_gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with _client(tenant_gateway, ACME) as client:
        yield client


@pytest.fixture
def globex(tenant_gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with _client(tenant_gateway, GLOBEX) as client:
        yield client


def _session(client: httpx.Client, **fields: object) -> str:
    response = client.post("/sessions", json={"model": STUB_MODEL, **fields})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def _turn(client: httpx.Client, session_id: str, content: str) -> str:
    response = client.post(f"/sessions/{session_id}/turns", json={"content": content})
    assert response.status_code == 202, response.text
    turn_id: str = response.json()["turn_id"]
    return turn_id


def test_links_turns_lists_the_history_in_pages(admin: httpx.Client) -> None:
    created = admin.post("/sessions", json={"model": STUB_MODEL})
    links = created.json()["links"]
    session_id = created.json()["session_id"]
    turns = [_turn(admin, session_id, f"question {n}") for n in range(3)]
    for turn_id in turns:
        wait_for_turn(uuid.UUID(turn_id))
    first = admin.get(links["turns"], params={"limit": 2})
    assert first.status_code == 200, first.text
    page = first.json()
    assert [t["id"] for t in page["turns"]] == turns[1:]
    assert [m["content"] for m in page["turns"][1]["messages"]] == ["question 2", "You said: question 2"]
    shown = admin.get(f"/turns/{turns[1]}").json()
    # The delivery's state, the journal's steps and a delayed turn's waiting message are GET
    # /turns/{id}'s alone (one turn's detail; the history lists no delayed turn), and so is the
    # tenant: on a page every turn is the session's, whose tenant the session carries.
    shown.pop("webhook")
    shown.pop("steps")
    assert shown.pop("pending_input") is None
    assert shown.pop("tenant") is None
    assert page["turns"][0] == shown, "each turn as GET /turns/{id} shows it"
    newer = _turn(admin, session_id, "arrives meanwhile")
    older = admin.get(links["turns"], params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [t["id"] for t in older["turns"]] == turns[:1] and older["next_cursor"] is None
    assert admin.get(links["turns"]).json()["turns"][-1]["id"] == newer
    assert "not a cursor" in error_of(admin.get(links["turns"], params={"cursor": "bogus"}), 422)
    assert "limit must be" in error_of(admin.get(links["turns"], params={"limit": "0"}), 422)
    assert "limit must be" in error_of(admin.get(links["turns"], params={"limit": "101"}), 422)


def test_sessions_are_listed_newest_first_and_filtered_by_metadata(admin: httpx.Client) -> None:
    label = uuid.uuid4().hex
    ids = [_session(admin, metadata={"label": label, "user": f"u{n % 2}"}) for n in range(4)]
    first = admin.get("/sessions", params={"metadata.label": label, "limit": 3}).json()
    assert [s["id"] for s in first["sessions"]] == ids[:0:-1]
    assert first["sessions"][0]["links"]["turns"] == f"/sessions/{ids[3]}/turns"
    rest = admin.get("/sessions", params={"metadata.label": label, "cursor": first["next_cursor"]}).json()
    assert [s["id"] for s in rest["sessions"]] == ids[:1] and rest["next_cursor"] is None
    only_u1 = admin.get("/sessions", params={"metadata.label": label, "metadata.user": "u1"}).json()
    assert [s["id"] for s in only_u1["sessions"]] == [ids[3], ids[1]]
    since = first["sessions"][1]["created_at"]
    newer = admin.get("/sessions", params={"metadata.label": label, "created_after": since}).json()
    assert [s["id"] for s in newer["sessions"]] == [ids[3]]
    assert "unknown query parameter 'sort'" in error_of(admin.get("/sessions", params={"sort": "x"}), 422)
    assert "time zone" in error_of(admin.get("/sessions", params={"created_after": "2026-01-01T00:00"}), 422)
    assert "ISO 8601" in error_of(admin.get("/sessions", params={"created_before": "yesterday"}), 422)


def test_show_and_change_a_session(admin: httpx.Client) -> None:
    session_id = _session(admin, system_prompt="old", metadata={"a": 1})
    shown = admin.get(f"/sessions/{session_id}").json()
    assert (shown["model"], shown["system_prompt"], shown["metadata"]) == (STUB_MODEL, "old", {"a": 1})
    assert shown["links"]["self"] == f"/sessions/{session_id}"
    changed = admin.patch(f"/sessions/{session_id}", json={"system_prompt": None, "metadata": {"b": "2"}})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["system_prompt"], changed.json()["metadata"]) == (None, {"b": "2"})
    assert changed.json()["model"] == STUB_MODEL, "fields not given stay"
    assert admin.get(f"/sessions/{session_id}").json()["metadata"] == {"b": "2"}
    patch = f"/sessions/{session_id}"
    hooked = admin.patch(patch, json={"webhook": "https://example.com/hook"})
    assert hooked.status_code == 200, hooked.text
    assert hooked.json()["webhook"] == "https://example.com/hook"
    assert "private address" in error_of(admin.patch(patch, json={"webhook": "http://10.1.2.3/h"}), 422)
    assert admin.patch(patch, json={"webhook": None}).json()["webhook"] is None
    assert "nothing to change" in error_of(admin.patch(patch, json={}), 422)
    assert "unknown field(s): framework" in error_of(admin.patch(patch, json={"framework": "none"}), 422)
    assert "model must be a string or null" in error_of(admin.patch(patch, json={"model": 5}), 422)
    assert "knowledge_bases must be a list" in error_of(admin.patch(patch, json={"knowledge_bases": "kb"}), 422)
    assert "no-such-kb" in error_of(admin.patch(patch, json={"knowledge_bases": ["no-such-kb"]}), 422)
    missing = f"/sessions/{uuid.uuid4()}"
    for response in (admin.get(missing), admin.patch(missing, json={"model": "echo"}), admin.delete(missing)):
        assert "does not exist" in error_of(response, 404)
    assert "not a UUID" in error_of(admin.get("/sessions/nope"), 404)


def test_delete_stops_a_streaming_reply_and_leaves_nothing_behind(admin: httpx.Client, redis_url: str) -> None:
    session_id = _session(admin)
    done = _turn(admin, session_id, "hello")
    wait_for_turn(uuid.UUID(done))
    running = _turn(admin, session_id, "long [words: 400] [slow: 0.05]")
    wait_for_status(uuid.UUID(running), "running")
    deleted = admin.delete(f"/sessions/{session_id}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"session_id": session_id, "turns": 2, "stopped": [running]}
    for path in (f"/sessions/{session_id}", f"/sessions/{session_id}/turns", f"/turns/{done}"):
        error_of(admin.get(path), 404)
    error_of(admin.get(f"/sessions/{session_id}/events"), 404)
    error_of(admin.get(f"/turns/{running}/events"), 404)
    wait_for_drained_queues(redis_url)
    ids = [session_id, done, running]
    assert tables_mentioning(ids) == {}
    wait_until("no Redis key names the session", lambda: redis_mentioning(redis_url, ids) == [])


def test_a_tenant_token_owns_what_it_creates_and_sees_nothing_else(
    admin: httpx.Client, acme: httpx.Client, globex: httpx.Client
) -> None:
    label = uuid.uuid4().hex
    mine = _session(acme, metadata={"label": label})
    assert acme.get(f"/sessions/{mine}").json()["tenant"] == "acme"
    turn = _turn(acme, mine, "hello")
    wait_for_turn(uuid.UUID(turn))
    theirs = _session(globex, metadata={"label": label})
    admins = _session(admin, metadata={"label": label})

    listed = acme.get("/sessions", params={"metadata.label": label}).json()["sessions"]
    assert [s["id"] for s in listed] == [mine]
    assert {s["id"] for s in admin.get("/sessions", params={"metadata.label": label}).json()["sessions"]} == {
        mine,
        theirs,
        admins,
    }, "the admin token sees every session"
    assert admin.get(f"/turns/{turn}").status_code == 200

    # Globex meets acme's session, turn and streams exactly as ids that do not exist.
    nowhere_session, nowhere_turn = str(uuid.uuid4()), str(uuid.uuid4())
    probes = [
        ("GET", "/sessions/{s}", None),
        ("PATCH", "/sessions/{s}", {"model": "echo"}),
        ("DELETE", "/sessions/{s}", None),
        ("GET", "/sessions/{s}/turns", None),
        ("POST", "/sessions/{s}/turns", {"content": "let me in"}),
        ("GET", "/sessions/{s}/events", None),
        ("GET", "/turns/{t}", None),
        ("POST", "/turns/{t}/cancel", None),
        ("GET", "/turns/{t}/events", None),
    ]
    for method, path, body in probes:
        foreign = globex.request(method, path.format(s=mine, t=turn), json=body)
        missing = globex.request(method, path.format(s=nowhere_session, t=nowhere_turn), json=body)
        foreign_error = error_of(foreign, 404).replace(mine, "ID").replace(turn, "ID")
        missing_error = error_of(missing, 404).replace(nowhere_session, "ID").replace(nowhere_turn, "ID")
        assert foreign_error == missing_error, (method, path)
    for path in (f"/sessions/{admins}", f"/sessions/{theirs}"):
        error_of(acme.get(path), 404)
    # Nothing of acme's changed.
    assert acme.get(f"/sessions/{mine}").json()["model"] == STUB_MODEL
    assert len(acme.get(f"/sessions/{mine}/turns").json()["turns"]) == 1
    assert acme.get(f"/turns/{turn}/events").status_code == 200
    assert acme.delete(f"/sessions/{mine}").status_code == 200
