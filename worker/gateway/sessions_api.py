"""The gateway's session endpoints: create, list, show, change, delete, and a session's turns.

Each runs behind the route table's prologue (`worker/gateway/routing.py`), which authorized the
token, parsed the session id and read the body. Every one is scoped by the token's tenant: a
tenant's token finds only its tenant's sessions, and another's answers 404 exactly as a session
that does not exist.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from worker.gateway.routing import Call, body_fields
from worker.gateway.state import optional_str, threaded

__all__ = [
    "DEFAULT_FRAMEWORK",
    "create_session",
    "delete_session",
    "list_session_turns",
    "list_sessions",
    "session_links",
    "show_session",
    "update_session",
]

MAX_LIMIT = 100
"""Most sessions or turns one page of the HTTP API holds."""

DEFAULT_LIMIT = 20

DEFAULT_FRAMEWORK = "langgraph"
"""The framework of a session created without one (preselected on the page)."""

PATCH_FIELDS = body_fields("SessionChange")

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


async def create_session(call: Call) -> Response:
    """Create a chat session."""
    from worker.producer import create_session as create

    data = call.data
    framework = data.get("framework", DEFAULT_FRAMEWORK)
    if not isinstance(framework, str):
        raise HTTPException(422, f"framework must be a string, got {type(framework).__name__}")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise HTTPException(422, f"metadata must be an object or null, got {type(metadata).__name__}")
    model, system_prompt = optional_str(data, "model"), optional_str(data, "system_prompt")
    webhook = optional_str(data, "webhook")
    session_id = await threaded(
        create,
        framework=framework,
        model=model,
        system_prompt=system_prompt,
        metadata=metadata,
        webhook=webhook,
        approval=data.get("approval"),  # checked as the Python API checks it (one line naming the forms)
        tenant=call.tenant,
    )
    return JSONResponse(
        {"session_id": str(session_id), "links": session_links(session_id)},
        status_code=201,
        headers={"Location": f"/sessions/{session_id}"},
    )


async def list_sessions(call: Call) -> Response:
    """List sessions, newest first, a page at a time."""
    from worker.history import list_sessions as list_page

    request = call.request
    metadata: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name.startswith("metadata.") and len(name) > len("metadata."):
            metadata[name[len("metadata.") :]] = value
        elif name not in LIST_PARAMS:
            raise HTTPException(422, f"unknown query parameter {name[:60]!r}; use limit, cursor, metadata.KEY, ...")
    page = await threaded(
        list_page,
        limit=_limit(request),
        cursor=_cursor(request),
        metadata=metadata or None,
        created_after=_time(request, "created_after"),
        created_before=_time(request, "created_before"),
        tenant=call.tenant,
    )
    return JSONResponse({"sessions": [_with_links(s) for s in page.sessions], "next_cursor": page.next_cursor})


async def show_session(call: Call) -> Response:
    """A session: framework, model, instructions, metadata, knowledge bases, counts."""
    from worker.history import get_session

    return JSONResponse(_with_links(await threaded(get_session, call.session_id, tenant=call.tenant)))


async def update_session(call: Call) -> Response:
    """Change a session's instructions, model, metadata, knowledge bases, webhook or approval policy."""
    from worker.producer import KEEP
    from worker.producer import update_session as update

    data = call.data
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
    session = await threaded(
        update,
        call.session_id,
        system_prompt=data.get("system_prompt", KEEP),
        model=data.get("model", KEEP),
        metadata=data.get("metadata", KEEP),
        knowledge_bases=names,
        webhook=data.get("webhook", KEEP),
        approval=data.get("approval", KEEP),
        tenant=call.tenant,
    )
    return JSONResponse(_with_links(session))


async def delete_session(call: Call) -> Response:
    """Delete a session with its history, after stopping its turns."""
    from worker.producer import delete_session as delete

    report = await threaded(delete, call.session_id, tenant=call.tenant)
    body = {"session_id": str(report.session_id), "turns": report.turns, "stopped": [str(t) for t in report.stopped]}
    return JSONResponse(body)


async def list_session_turns(call: Call) -> Response:
    """A session's turns with their messages, the newest page first."""
    from worker.history import list_turns

    request = call.request
    limit, cursor = _limit(request), _cursor(request)
    page = await threaded(list_turns, call.session_id, limit=limit, before=cursor, tenant=call.tenant)
    return JSONResponse({"turns": page.turns, "next_cursor": page.next_cursor})
