"""The gateway's route table (`worker/gateway/routes.py`): every row is served behind the one prologue
and documented from the same row, and the document holds nothing the table does not.

The app runs in this process through Starlette's test client; every request here is answered by the
prologue (no token, a bad id, an unknown field) before any Postgres or Redis call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from chatq.settings import Settings
from worker.gateway.app import create_app
from worker.gateway.config import GatewaySettings
from worker.gateway.openapi import BASE_SCHEMA
from worker.gateway.routes import ROUTES
from worker.gateway.routing import PATH_IDS, Endpoint

TOKEN = "routes-test-token"
Document = dict[str, Any]
"""The served document's `paths`."""
DOCUMENTED = [row for row in ROUTES if row.summary is not None]


def _id(row: Endpoint) -> str:
    return f"{row.method} {row.path}"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(
        create_app(GatewaySettings(tokens=(TOKEN,)), chatq=Settings()), base_url="http://localhost"
    ) as client:
        yield client


@pytest.fixture(scope="module")
def document(client: TestClient) -> Document:
    paths = client.get("/openapi.json").json()["paths"]
    assert isinstance(paths, dict)
    return paths


def _filled(path: str) -> str:
    for name in PATH_IDS:
        path = path.replace("{" + name + "}", "not-a-uuid")
    return path


def test_every_row_is_served_and_every_documented_row_is_in_the_document_and_nothing_else(
    client: TestClient, document: Document
) -> None:
    served = {
        (method, route.path)
        for route in client.app.routes  # type: ignore[attr-defined]
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert served == {(row.method, row.path) for row in ROUTES}
    assert len(served) == len(ROUTES), "a method and path twice in the table"
    documented = {(method.upper(), path) for path, operations in document.items() for method in operations}
    assert documented == {(row.method, row.path) for row in DOCUMENTED}


@pytest.mark.parametrize("row", [row for row in ROUTES if not row.public], ids=_id)
def test_every_private_row_wants_the_token_first(client: TestClient, row: Endpoint, document: Document) -> None:
    answer = client.request(row.method, _filled(row.path), json={"no such field": 1})
    assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
    assert "401" in document[row.path][row.method.lower()]["responses"]


@pytest.mark.parametrize("row", [row for row in ROUTES if row.path_ids], ids=_id)
def test_every_row_naming_an_object_parses_its_id_after_the_token(
    client: TestClient,
    row: Endpoint,
    document: Document,
) -> None:
    answer = client.request(row.method, _filled(row.path), headers={"Authorization": f"Bearer {TOKEN}"})
    kind = PATH_IDS[row.path_ids[0]][0]
    assert answer.status_code == 404
    assert answer.json() == {"error": f"no such {kind}: 'not-a-uuid' is not a UUID"}
    operation = document[row.path][row.method.lower()]
    assert "404" in operation["responses"]
    assert [p["$ref"].rsplit("/", 1)[1] for p in operation["parameters"]][: len(row.path_ids)] == [
        {"session_id": "SessionId", "turn_id": "TurnId", "schedule_id": "ScheduleId"}[name] for name in row.path_ids
    ]


@pytest.mark.parametrize("row", [row for row in ROUTES if row.body is not None], ids=_id)
def test_every_row_with_a_body_accepts_exactly_its_schemas_fields(
    client: TestClient,
    row: Endpoint,
    document: Document,
) -> None:
    assert row.body is not None
    fields = sorted(BASE_SCHEMA["components"]["schemas"][row.body]["properties"])
    nil = "00000000-0000-0000-0000-000000000000"
    path = row.path
    for name in PATH_IDS:
        path = path.replace("{" + name + "}", nil)
    answer = client.request(row.method, path, json={"bogus": 1}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 422
    assert answer.json() == {"error": f"unknown field(s): bogus; expected some of: {', '.join(fields)}"}
    operation = document[row.path][row.method.lower()]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": f"#/components/schemas/{row.body}"
    }
    assert {"413", "415", "422"} <= set(operation["responses"])
