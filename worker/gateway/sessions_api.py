"""The gateway's session endpoints beyond creation: list, show, change, delete, and a session's turns.

Every one is scoped by the request's token (`Gateway.authorize`): a tenant's token finds only its
tenant's sessions, and another's answers 404 exactly as a session that does not exist.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.gateway.state import check_fields, gateway_of, path_uuid, threaded

__all__ = ["delete_session", "list_session_turns", "list_sessions", "show_session", "update_session"]

MAX_LIMIT = 100
"""Most sessions or turns one page of the HTTP API holds."""

DEFAULT_LIMIT = 20

PATCH_FIELDS = frozenset({"system_prompt", "model", "metadata", "knowledge_bases", "webhook"})

LIST_PARAMS = frozenset({"limit", "cursor", "created_after", "created_before"})


def session_links(session_id: uuid.UUID | str) -> dict[str, str]:
    """Where a session's parts are, for every answer that names a session."""
    return {
        "self": f"/sessions/{session_id}",
        "turns": f"/sessions/{session_id}/turns",
        "events": f"/sessions/{session_id}/events",
    }


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise HTTPException(422, f"limit must be a whole number from 1 to {MAX_LIMIT}, got {raw[:20]!r}")
    return int(raw)


def _cursor(request: Request) -> str | None:
    raw = request.query_params.get("cursor")
    return raw if raw else None


def _time(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(422, f"{name} must be an ISO 8601 time such as 2026-12-01T10:00:00Z") from None
    if moment.tzinfo is None:
        raise HTTPException(422, f"{name} needs a time zone (Z or +hh:mm)")
    return moment


def _with_links(session: dict[str, Any]) -> dict[str, Any]:
    return {**session, "links": session_links(session["id"])}


async def list_sessions(request: Request) -> Response:
    """List sessions, newest first, a page at a time.
    ---
    summary: List sessions
    description: >-
      Newest first, in keyset pages: `next_cursor` (while more remain) is the `cursor` of the next,
      older page, and a page is the same however many sessions are created meanwhile.
      `metadata.KEY=VALUE` keeps sessions whose metadata has KEY set to the string VALUE
      (repeat for several keys). A tenant's token lists only its tenant's sessions.
    tags: [sessions]
    parameters:
      - {$ref: "#/components/parameters/Limit"}
      - {$ref: "#/components/parameters/Cursor"}
      - {name: created_after, in: query, required: false, schema: {type: string, format: date-time}}
      - {name: created_before, in: query, required: false, schema: {type: string, format: date-time}}
      - name: metadata.KEY
        in: query
        required: false
        description: "only sessions whose metadata has KEY = this string (e.g. `metadata.user=u42`)"
        schema: {type: string}
    responses:
      "200":
        description: a page of sessions
        content:
          application/json:
            schema: {$ref: "#/components/schemas/SessionPage"}
      "401": {$ref: "#/components/responses/Error401"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.history import SessionPage
    from worker.history import list_sessions as list_page

    tenant = gateway_of(request).authorize(request)
    metadata: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith("metadata.") and len(name) > len("metadata."):
            metadata[name[len("metadata.") :]] = value
        elif name not in LIST_PARAMS:
            raise HTTPException(422, f"unknown query parameter {name[:60]!r}; use limit, cursor, metadata.KEY, ...")
    limit, cursor = _limit(request), _cursor(request)
    after, before = _time(request, "created_after"), _time(request, "created_before")

    def run() -> SessionPage:
        return list_page(
            limit=limit,
            cursor=cursor,
            metadata=metadata or None,
            created_after=after,
            created_before=before,
            tenant=tenant,
        )

    page = await threaded(run)
    return JSONResponse({"sessions": [_with_links(s) for s in page.sessions], "next_cursor": page.next_cursor})


async def show_session(request: Request) -> Response:
    """A session: framework, model, instructions, metadata, knowledge bases, counts.
    ---
    summary: Show a session
    tags: [sessions]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
    responses:
      "200":
        description: the session as stored
        content:
          application/json:
            schema: {$ref: "#/components/schemas/StoredSession"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.history import get_session

    tenant = gateway_of(request).authorize(request)
    session_id = path_uuid(request, "session_id", "session")

    def run() -> dict[str, Any]:
        return get_session(session_id, tenant=tenant)

    return JSONResponse(_with_links(await threaded(run)))


async def update_session(request: Request) -> Response:
    """Change a session's instructions, model, metadata, knowledge bases or webhook.
    ---
    summary: Change a session
    description: >-
      Only the fields given change. `system_prompt: null` removes the instructions, `model: null`
      makes turns run on the worker's default model, `metadata` replaces the metadata, and
      `knowledge_bases` (names) replaces the attached set, and `webhook` (an http(s) URL, null: none)
      is where turns that end from now on are POSTed. Turns claimed from now on see the change; a
      running turn finishes as it started.
    tags: [sessions]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
    requestBody:
      required: true
      content:
        application/json:
          schema: {$ref: "#/components/schemas/SessionChange"}
    responses:
      "200":
        description: the session after the change
        content:
          application/json:
            schema: {$ref: "#/components/schemas/StoredSession"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "413": {$ref: "#/components/responses/Error413"}
      "415": {$ref: "#/components/responses/Error415"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.producer import KEEP
    from worker.producer import update_session as update

    gateway = gateway_of(request)
    tenant = gateway.authorize(request)
    session_id = path_uuid(request, "session_id", "session")
    data = await gateway.read_json(request)
    check_fields(data, PATCH_FIELDS)
    if not data:
        raise HTTPException(422, f"nothing to change: send some of {', '.join(sorted(PATCH_FIELDS))}")
    for name in ("system_prompt", "model"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise HTTPException(422, f"{name} must be a string or null, got {type(data[name]).__name__}")
    if data.get("metadata") is not None and not isinstance(data["metadata"], dict):
        raise HTTPException(422, f"metadata must be an object or null, got {type(data['metadata']).__name__}")
    names = data.get("knowledge_bases", KEEP)
    if names is not KEEP and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise HTTPException(422, "knowledge_bases must be a list of knowledge base names")

    def run() -> dict[str, Any]:
        return update(
            session_id,
            system_prompt=data.get("system_prompt", KEEP),
            model=data.get("model", KEEP),
            metadata=data.get("metadata", KEEP),
            knowledge_bases=names,
            webhook=data.get("webhook", KEEP),
            tenant=tenant,
        )

    return JSONResponse(_with_links(await threaded(run)))


async def delete_session(request: Request) -> Response:
    """Delete a session with its history, after stopping its turns.
    ---
    summary: Delete a session
    description: >-
      Queued turns are cancelled and running ones stopped first; then the session, its turns,
      messages, tool-call records and event streams are removed. Usage totals without content
      (tokens and paid-tool costs per day, tenant and model) are kept for billing.
    tags: [sessions]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
    responses:
      "200":
        description: the session is gone
        content:
          application/json:
            schema: {$ref: "#/components/schemas/DeletedSession"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.producer import DeletedSessionReport
    from worker.producer import delete_session as delete

    tenant = gateway_of(request).authorize(request)
    session_id = path_uuid(request, "session_id", "session")

    def run() -> DeletedSessionReport:
        return delete(session_id, tenant=tenant)

    report = await threaded(run)
    body = {"session_id": str(report.session_id), "turns": report.turns, "stopped": [str(t) for t in report.stopped]}
    return JSONResponse(body)


async def list_session_turns(request: Request) -> Response:
    """A session's turns with their messages, the newest page first.
    ---
    summary: List a session's turns
    description: >-
      The newest `limit` turns, oldest first within the page, each with its messages (as
      `GET /turns/{id}` shows a turn). While older turns remain, `next_cursor` is the `cursor` of
      the page before this one; turns submitted meanwhile never shift a page.
    tags: [turns]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
      - {$ref: "#/components/parameters/Limit"}
      - {$ref: "#/components/parameters/Cursor"}
    responses:
      "200":
        description: a page of turns
        content:
          application/json:
            schema: {$ref: "#/components/schemas/TurnPage"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.history import TurnPage, list_turns

    tenant = gateway_of(request).authorize(request)
    session_id = path_uuid(request, "session_id", "session")
    limit, cursor = _limit(request), _cursor(request)

    def run() -> TurnPage:
        return list_turns(session_id, limit=limit, before=cursor, tenant=tenant)

    page = await threaded(run)
    return JSONResponse({"turns": page.turns, "next_cursor": page.next_cursor})
