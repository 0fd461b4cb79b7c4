"""Every endpoint that names an object, walked by one tenant's token over its own object, another
tenant's and one that does not exist: another tenant's answers exactly as nothing at all (status
code and body, ids substituted), its own as something found.

The gateway runs in this process (uvicorn on a thread, the real app, Postgres and Redis); no
worker is needed, turns stay queued. This file is a package of its own so that no package-scoped
worker of another package (the gateway's) is alive to run those turns during the walk.
Before this walk, a turn id of another tenant answered 409
naming that tenant's session, and any tenant attached and probed any knowledge base by name.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
import uvicorn

from chatq.gateway_variables import TenantToken
from chatq.settings import get_settings
from models.knowledge import create_knowledge_base
from worker.gateway.app import create_app
from worker.gateway.config import GatewaySettings
from worker.gateway.server import GatewayServer
from worker.payload import GUARDED_QUEUES

ADMIN = "admin-" + secrets.token_hex(16)
SUFFIX = uuid.uuid4().hex[:8]
ACME, GLOBEX = f"acme-{SUFFIX}", f"globex-{SUFFIX}"
TOKENS = {ACME: "acme-" + secrets.token_hex(16), GLOBEX: "globex-" + secrets.token_hex(16)}


@pytest.fixture(scope="module")
def base_url(chatq_env: dict[str, str], redis_url: str) -> Iterator[str]:
    """The gateway app under uvicorn on a thread of this process: the admin token and two tenants'."""
    settings = GatewaySettings(
        tokens=(ADMIN,),
        tenant_tokens=tuple(TenantToken(tenant=t, token=token) for t, token in TOKENS.items()),
        heartbeat=0.5,
    )
    app = create_app(settings, chatq=get_settings())
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = GatewayServer(config, app.state.gateway)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process gateway did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)
    # No worker runs these turns here; a later package's worker must not run them either.
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(*GUARDED_QUEUES)
    finally:
        client.close()


def _client(base_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@dataclass(frozen=True, kw_only=True)
class Objects:
    """What a tenant owns: a session, a queued turn in it, the turn's user message, a knowledge base,
    a schedule on the session."""

    session: str
    turn: str
    message: str
    knowledge_base: str
    schedule: str

    def ids(self) -> dict[str, str]:
        return {"s": self.session, "t": self.turn, "m": self.message, "kb": self.knowledge_base, "sc": self.schedule}


def _owned_by(client: httpx.Client, tenant: str) -> Objects:
    created = client.post("/sessions", json={"model": "echo", "framework": "none"})
    assert created.status_code == 201, created.text
    session = created.json()["session_id"]
    submitted = client.post(f"/sessions/{session}/turns", json={"content": "hello"})
    assert submitted.status_code == 202, submitted.text
    turn = submitted.json()["turn_id"]
    shown = client.get(f"/turns/{turn}")
    assert shown.status_code == 200, shown.text
    message = str(shown.json()["messages"][0]["id"])
    knowledge_base = f"{tenant}-docs-{uuid.uuid4().hex[:8]}"
    create_knowledge_base(knowledge_base, tenant=tenant)
    scheduled = client.post("/schedules", json={"session_id": session, "content": "tick", "every": 3600})
    assert scheduled.status_code == 201, scheduled.text
    return Objects(
        session=session,
        turn=turn,
        message=message,
        knowledge_base=knowledge_base,
        schedule=scheduled.json()["id"],
    )


def _nowhere() -> Objects:
    return Objects(
        session=str(uuid.uuid4()),
        turn=str(uuid.uuid4()),
        message=str(9_000_000_000_000_000 + secrets.randbelow(10**15)),
        knowledge_base=f"nowhere-{uuid.uuid4().hex[:8]}",
        schedule=str(uuid.uuid4()),
    )


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One request; `{s}`, `{t}`, `{m}`, `{kb}` in its path, query and body name the object walked."""

    method: str
    path: str
    params: dict[str, str] | None = None
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    query_token: bool = False
    """Send the token as `?access_token=` (what the chat page's EventSource does), not as a header."""
    invalid: bool = False
    """The request itself is refused before any lookup: the same answer for the tenant's own object too."""

    def fill(self, value: Any, ids: dict[str, str]) -> Any:
        if isinstance(value, str):
            filled = value
            for name, object_id in ids.items():
                filled = filled.replace("{" + name + "}", object_id)
            return int(filled) if value == "{m}" else filled
        if isinstance(value, dict):
            return {key: self.fill(item, ids) for key, item in value.items()}
        if isinstance(value, list):
            return [self.fill(item, ids) for item in value]
        return value


OWN_SESSION = "{own}"
"""In a path: the requesting tenant's own session, whatever object the probe walks."""

# The object is the path's session or turn, or (on the tenant's own session) a message, a turn id
# or a knowledge base named in the body. Mutating probes come last: the object must still be there.
PROBES = [
    Probe(method="GET", path="/sessions/{s}"),
    Probe(method="GET", path="/sessions/{s}/turns"),
    Probe(method="GET", path="/sessions/{s}/turns", params={"limit": "50"}),  # what the page asks
    Probe(method="GET", path="/sessions/{s}/turns", params={"limit": "0"}, invalid=True),
    Probe(method="GET", path="/sessions/{s}/events"),
    Probe(method="GET", path="/sessions/{s}/events", query_token=True),
    Probe(method="GET", path="/sessions/{s}/events", headers={"Last-Event-ID": "0:0"}),
    Probe(method="GET", path="/sessions/{s}/events", headers={"Last-Event-ID": "nonsense"}, invalid=True),
    Probe(method="GET", path="/turns/{t}"),
    Probe(method="GET", path="/turns/{t}/events"),
    Probe(method="GET", path="/turns/{t}/events", query_token=True, params={"last_event_id": "1"}),
    Probe(method="GET", path="/turns/{t}/events", headers={"Last-Event-ID": "x"}, invalid=True),
    Probe(method="PATCH", path="/sessions/{s}", body={"metadata": {"probe": "1"}}),
    Probe(method="PATCH", path="/sessions/{s}", body={"knowledge_bases": ["{kb}"]}),
    Probe(method="PATCH", path="/sessions/{s}", body={"unknown": 1}, invalid=True),
    Probe(method="PATCH", path="/sessions/{own}", body={"knowledge_bases": ["{kb}"]}),
    Probe(method="PATCH", path="/sessions/{own}", body={"knowledge_bases": ["{kb}", "{kb}"]}),
    Probe(method="POST", path="/sessions/{s}/turns", body={"content": "let me in"}),
    Probe(method="POST", path="/sessions/{s}/turns", body={"content": ""}),
    Probe(method="POST", path="/sessions/{s}/turns", body={"content": "again", "if_busy": "reject"}),
    Probe(method="POST", path="/sessions/{own}/turns", body={"content": "reply", "reply_to": "{m}"}),
    Probe(method="POST", path="/turns/{t}/approvals", body={"approve": True}),
    Probe(method="POST", path="/turns/{t}/approvals", body={"call_id": "c1", "approve": False, "reason": "no"}),
    Probe(method="POST", path="/turns/{t}/approvals", body={"approve": "yes"}, invalid=True),
    Probe(method="POST", path="/turns/{t}/cancel"),
    Probe(method="GET", path="/schedules/{sc}"),
    Probe(method="POST", path="/schedules", body={"session_id": "{s}", "content": "mine now", "every": 3600}),
    Probe(method="PATCH", path="/schedules/{sc}", body={"name": "probe"}),
    Probe(method="PATCH", path="/schedules/{sc}", body={"unknown": 1}, invalid=True),
    Probe(method="POST", path="/schedules/{sc}/pause"),
    Probe(method="POST", path="/schedules/{sc}/resume"),
    Probe(method="DELETE", path="/schedules/{sc}"),
    Probe(method="DELETE", path="/sessions/{s}"),
]


def _answer(client: httpx.Client, probe: Probe, ids: dict[str, str], own_session: str, token: str) -> Any:
    """The answer to `probe` on the object `ids`: status, headers, and the body with every id of
    `ids` replaced by its name, so that answers about different objects compare equal."""
    ids = {**ids, "own": own_session}
    params = dict(probe.fill(probe.params or {}, ids))
    headers = dict(probe.headers or {})
    if probe.query_token:
        params["access_token"] = token
        headers["Authorization"] = ""
    request = client.build_request(
        probe.method,
        probe.fill(probe.path, ids),
        params=params,
        json=probe.fill(probe.body, ids) if probe.body is not None else None,
        headers=headers,
    )
    if probe.query_token:
        del request.headers["Authorization"]
    response = client.send(request, stream=True)
    try:
        kind = response.headers.get("content-type", "")
        # An event stream of one's own never ends by itself: what matters is that it opened.
        body = "<event stream>" if kind.startswith("text/event-stream") else response.read().decode()
    finally:
        response.close()
    named = repr((probe.path, probe.params, probe.body))
    for name, object_id in ids.items():
        if "{" + name + "}" in named and name != "own":  # only the probe's own ids (a message id is a small number)
            body = re.sub(rf"(?<![\w-]){re.escape(object_id)}(?![\w-])", "{" + name + "}", body)
    # Every header too, but the date and the length (a message id of another length is substituted).
    headers_seen = sorted((k, v) for k, v in response.headers.items() if k not in ("date", "content-length"))
    return response.status_code, headers_seen, body


def test_another_tenants_objects_answer_exactly_as_objects_that_do_not_exist(base_url: str) -> None:
    with (
        _client(base_url, TOKENS[ACME]) as acme,
        _client(base_url, TOKENS[GLOBEX]) as globex,
        _client(base_url, ADMIN) as admin,
    ):
        theirs = _owned_by(acme, ACME)
        mine = _owned_by(globex, GLOBEX)
        # The routes that name an object are all walked (a new one must be added here).
        walked = {
            (
                p.method,
                p.path.replace("{s}", "{session_id}").replace("{t}", "{turn_id}").replace("{sc}", "{schedule_id}"),
            )
            for p in PROBES
        }
        for route in admin.get("/openapi.json").json()["paths"].items():
            path, operations = route
            if "{" in path:
                assert {(method.upper(), path) for method in operations} <= walked, path
        for probe in PROBES:
            nowhere = _nowhere()
            foreign = _answer(globex, probe, theirs.ids(), mine.session, TOKENS[GLOBEX])
            missing = _answer(globex, probe, nowhere.ids(), mine.session, TOKENS[GLOBEX])
            assert foreign == missing, (probe, foreign, missing)
            own = _answer(globex, probe, mine.ids(), mine.session, TOKENS[GLOBEX])
            if probe.invalid:
                assert foreign[0] == 422 and own == missing, (probe, own)
            else:
                assert foreign[0] in (404, 422) and own[0] != foreign[0], (probe, own, foreign)

        # Nothing of acme's changed or went: its turn still queued, its session still there.
        assert acme.get(f"/turns/{theirs.turn}").json()["status"] == "queued"
        assert acme.get(f"/sessions/{theirs.session}").json()["metadata"] == {}
        assert acme.get(f"/sessions/{theirs.session}").json()["knowledge_bases"] == []
        theirs_scheduled = acme.get(f"/schedules/{theirs.schedule}").json()
        assert (theirs_scheduled["name"], theirs_scheduled["enabled"]) == (None, True)
        listed_schedules = {s["id"] for s in globex.get("/schedules").json()["schedules"]}
        assert theirs.schedule not in listed_schedules
        # A queued turn awaits no decision: its own tenant is told so (409), nothing changed.
        assert acme.post(f"/turns/{theirs.turn}/approvals", json={"approve": True}).status_code == 409
        # The chat page's session list (and any list) holds only the tenant's own sessions.
        listed = {s["id"] for s in globex.get("/sessions", params={"limit": "20"}).json()["sessions"]}
        assert theirs.session not in listed
        admin_listed = {s["id"] for s in admin.get("/sessions", params={"limit": "20"}).json()["sessions"]}
        assert theirs.session in admin_listed, "the admin token sees every tenant's sessions"


def test_a_used_turn_id_conflicts_the_same_whoever_owns_it(base_url: str) -> None:
    with _client(base_url, TOKENS[ACME]) as acme, _client(base_url, TOKENS[GLOBEX]) as globex:
        theirs = _owned_by(acme, ACME)
        mine = _owned_by(globex, GLOBEX)
        second = globex.post("/sessions", json={"model": "echo", "framework": "none"}).json()["session_id"]

        def submit(turn_id: str) -> tuple[int, str]:
            response = globex.post(f"/sessions/{second}/turns", json={"content": "hello", "turn_id": turn_id})
            return response.status_code, response.text.replace(turn_id, "{t}")

        foreign, own = submit(theirs.turn), submit(mine.turn)
        assert foreign[0] == 409 and foreign == own
        assert theirs.session not in foreign[1] and "session" not in foreign[1]
        unused = str(uuid.uuid4())
        status, body = submit(unused)
        assert status == 202 and '"turn_id":"{t}"' in body.replace(" ", "")
        # The same turn again in its own session is an idempotent resubmission, not a conflict.
        again = globex.post(f"/sessions/{mine.session}/turns", json={"content": "hello", "turn_id": mine.turn})
        assert again.status_code == 200 and again.json()["created"] is False
