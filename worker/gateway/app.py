"""The gateway's ASGI app (Starlette): `create_app(settings)`.

Postgres calls and the Celery send run in Starlette's thread pool; Redis is used through
`redis.asyncio`, so a thousand idle event streams cost a thousand sockets, not a thousand threads.
"""

from __future__ import annotations

import contextlib
import html
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from redis.exceptions import RedisError
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, StatementError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator
from starlette.types import ASGIApp, Receive, Scope, Send

from chatq.settings import get_settings, mask_secrets
from models.errors import KnowledgeBaseNotFound
from worker.errors import (
    ChatqError,
    InvalidTurn,
    NotCancellable,
    ServiceUnavailable,
    SessionBusy,
    SessionNotFound,
    TurnConflict,
    TurnNotFound,
)
from worker.gateway.auth import host_header_is_loopback
from worker.gateway.config import GatewaySettings
from worker.gateway.openapi import base_schema
from worker.gateway.sessions_api import (
    delete_session,
    list_session_turns,
    list_sessions,
    session_links,
    show_session,
    update_session,
)
from worker.gateway.state import (
    Gateway,
    check_fields,
    gateway_of,
    json_error,
    optional_str,
    path_uuid,
    threaded,
)
from worker.gateway.streams import stream_session, stream_turn
from worker.storable import is_outage, refusal_message

log = logging.getLogger(__name__)

_ERROR_STATUS: dict[type[ChatqError], int] = {
    InvalidTurn: 422,
    SessionNotFound: 404,
    TurnNotFound: 404,
    SessionBusy: 409,
    TurnConflict: 409,
    NotCancellable: 409,
    ServiceUnavailable: 503,
    KnowledgeBaseNotFound: 422,
}

SESSION_FIELDS = frozenset({"framework", "model", "system_prompt", "metadata", "webhook"})
TURN_FIELDS = frozenset({"content", "images", "reply_to", "turn_id", "if_busy", "webhook"})


# ----------------------------------------------------------------------------------- endpoints


FRAMEWORKS_MARK = b"<!-- frameworks -->"
"""Where the page's framework <select> gets its options."""

DEFAULT_FRAMEWORK = "langgraph"
"""The framework of a session created without one (preselected on the page)."""

FAVICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    b'<rect width="32" height="32" rx="7" fill="#3b6fd8"/>'
    b'<path d="M8 10h16v10H14l-5 4v-4H8z" fill="#fff"/></svg>'
)
"""The page's icon: a speech bubble, served so that browsers asking for one get no 404."""


def framework_options() -> bytes:
    """The page's framework choices, from the framework registry (a new framework shows up by itself)."""
    from handlers import framework_choices

    options = [
        f'<option value="{html.escape(value)}"{" selected" if value == DEFAULT_FRAMEWORK else ""}>'
        f"{html.escape(label)}</option>"
        for value, label in framework_choices()
    ]
    return "".join(options).encode("utf-8")


async def page(request: Request) -> Response:
    gateway = gateway_of(request)
    return Response(
        gateway.page.replace(FRAMEWORKS_MARK, framework_options()),
        media_type="text/html",
        headers={
            "Content-Security-Policy": gateway.page_csp,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


async def favicon(request: Request) -> Response:
    return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "public, max-age=86400"})


async def healthz(request: Request) -> Response:
    """Liveness of the gateway process (no Redis or Postgres round trip).
    ---
    summary: Liveness check
    description: >-
      200 whenever the process answers, whatever the state of Postgres and Redis: restart the
      gateway when this fails, not when they do (that is `/readyz`).
    security: []
    responses:
      "200":
        description: the gateway process answers
        content:
          application/json:
            schema: {type: object, properties: {status: {type: string, enum: [ok]}}}
    """
    return JSONResponse({"status": "ok"})


_SERVICE_NAMES = {"postgres": "Postgres", "redis": "Redis"}


async def readyz(request: Request) -> Response:
    """Readiness: whether Postgres and Redis both answer, each checked within two seconds.
    ---
    summary: Readiness check
    description: >-
      Checks Postgres (`SELECT 1`) and Redis (`PING`) side by side, each bounded, so the answer
      never takes much over two seconds. Send traffic to the gateway only while this is 200.
    security: []
    responses:
      "200":
        description: Postgres and Redis answer
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Readiness"}
      "503":
        description: Postgres or Redis (or both) does not answer; `error` names which
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Readiness"}
    """
    checks = await gateway_of(request).readiness()
    down = [_SERVICE_NAMES[name] for name, state in checks.items() if state != "ok"]
    if not down:
        return JSONResponse({"status": "ready", **checks})
    error = f"not ready: {' and '.join(down)} {'does' if len(down) == 1 else 'do'} not answer"
    return JSONResponse({"status": "not ready", **checks, "error": error}, status_code=503)


async def openapi(request: Request) -> Response:
    from handlers import framework_names

    schema = base_schema(framework_names(), default=DEFAULT_FRAMEWORK)
    return JSONResponse(SchemaGenerator(schema).get_schema(routes=request.app.routes))


async def create_session(request: Request) -> Response:
    """Create a chat session.
    ---
    summary: Create a chat session
    tags: [sessions]
    requestBody:
      required: false
      content:
        application/json:
          schema: {$ref: "#/components/schemas/NewSession"}
    responses:
      "201":
        description: the new session
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Session"}
      "401": {$ref: "#/components/responses/Error401"}
      "413": {$ref: "#/components/responses/Error413"}
      "415": {$ref: "#/components/responses/Error415"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.producer import create_session as create

    gateway = gateway_of(request)
    tenant = gateway.authorize(request)
    data = await gateway.read_json(request)
    check_fields(data, SESSION_FIELDS)
    framework = data.get("framework", DEFAULT_FRAMEWORK)
    if not isinstance(framework, str):
        raise HTTPException(422, f"framework must be a string, got {type(framework).__name__}")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise HTTPException(422, f"metadata must be an object or null, got {type(metadata).__name__}")
    model, system_prompt = optional_str(data, "model"), optional_str(data, "system_prompt")
    webhook = optional_str(data, "webhook")

    def run() -> uuid.UUID:
        return create(
            framework=framework,
            model=model,
            system_prompt=system_prompt,
            metadata=metadata,
            webhook=webhook,
            tenant=tenant,
        )

    session_id = await threaded(run)
    return JSONResponse(
        {"session_id": str(session_id), "links": session_links(session_id)},
        status_code=201,
        headers={"Location": f"/sessions/{session_id}"},
    )


async def submit_turn(request: Request) -> Response:
    """Submit a turn (a user message) to a session.
    ---
    summary: Submit a turn
    description: >-
      Stores the turn as queued with its user message, then sends it to the workers. 202 for a new
      turn; 200 when `turn_id` names a turn already submitted with the same content (idempotent).
      With Redis down the turn is still stored, so the answer is 202 with `sent: false` (not 503):
      the sweeper sends it once Redis answers again, and a client must not submit it a second time.
    tags: [turns]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
    requestBody:
      required: true
      content:
        application/json:
          schema: {$ref: "#/components/schemas/NewTurn"}
    responses:
      "202":
        description: the turn is stored as queued (`sent` false if Redis did not take it yet)
        content:
          application/json:
            schema: {$ref: "#/components/schemas/SubmittedTurn"}
      "200":
        description: the same turn was already submitted
        content:
          application/json:
            schema: {$ref: "#/components/schemas/SubmittedTurn"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "409": {$ref: "#/components/responses/Error409"}
      "413": {$ref: "#/components/responses/Error413"}
      "415": {$ref: "#/components/responses/Error415"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.producer import SubmittedTurn, get_session
    from worker.producer import submit_turn as submit

    gateway = gateway_of(request)
    tenant = gateway.authorize(request)
    session_id = path_uuid(request, "session_id", "session")
    data = await gateway.read_json(request)
    check_fields(data, TURN_FIELDS)
    if "content" not in data:
        raise HTTPException(422, "content is required: the user's message as a string")
    content = data["content"]
    if not isinstance(content, str):
        raise HTTPException(422, f"content must be a string, got {type(content).__name__}")
    if_busy = data.get("if_busy") or "enqueue"
    if not isinstance(if_busy, str):
        raise HTTPException(422, f"if_busy must be a string, got {type(if_busy).__name__}")
    images, reply_to, turn_id = data.get("images"), data.get("reply_to"), optional_str(data, "turn_id")
    if images is not None and not isinstance(images, list):
        raise HTTPException(422, f"images must be a list of URLs or null, got {type(images).__name__}")
    webhook = optional_str(data, "webhook")

    def run() -> SubmittedTurn:
        if tenant is not None:
            get_session(session_id, tenant=tenant)  # another tenant's session: 404, as if it did not exist
        return submit(
            session_id, content, images=images, reply_to=reply_to, turn_id=turn_id, if_busy=if_busy, webhook=webhook
        )

    turn = await threaded(run)
    links = {"turn": f"/turns/{turn.turn_id}", "events": f"/turns/{turn.turn_id}/events"}
    body = {
        "turn_id": str(turn.turn_id),
        "session_id": str(turn.session_id),
        "position": turn.position,
        "created": turn.created,
        "sent": turn.sent,
        "cancelled": [str(other) for other in turn.cancelled],
        "links": links,
    }
    return JSONResponse(body, status_code=202 if turn.created else 200, headers={"Location": links["turn"]})


async def show_turn(request: Request) -> Response:
    """A turn with its messages, as `chatq show --json` prints it.
    ---
    summary: Show a turn
    tags: [turns]
    parameters:
      - {$ref: "#/components/parameters/TurnId"}
    responses:
      "200":
        description: the turn as stored in Postgres
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Turn"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.queries import turn_report

    tenant = gateway_of(request).authorize(request)
    turn_id = path_uuid(request, "turn_id", "turn")

    def run() -> dict[str, Any]:
        return turn_report(turn_id, tenant=tenant)

    return JSONResponse(await threaded(run))


async def cancel_turn(request: Request) -> Response:
    """Cancel a queued or running turn.
    ---
    summary: Cancel a turn
    description: >-
      A queued turn ends `cancelled` at once; a running one is asked to stop (status `running` here,
      then its `cancelled` event within about a second, even while the model sends nothing). A turn
      already cancelled, or already asked to stop, answers `already_cancelled: true` and changes nothing.
    tags: [turns]
    parameters:
      - {$ref: "#/components/parameters/TurnId"}
    responses:
      "200":
        description: cancelled, or asked to stop
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Cancelled"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "409": {$ref: "#/components/responses/Error409"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.producer import Cancellation
    from worker.producer import cancel_turn as cancel

    tenant = gateway_of(request).authorize(request)
    turn_id = path_uuid(request, "turn_id", "turn")

    def run() -> Cancellation:
        return cancel(turn_id, tenant=tenant)

    done = await threaded(run)
    return JSONResponse({"turn_id": str(turn_id), "status": done.status.value, "already_cancelled": done.already})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return json_error(exc.status_code, str(exc.detail), headers)


async def _chatq_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ChatqError)
    status = next((code for kind, code in _ERROR_STATUS.items() if isinstance(exc, kind)), 500)
    return json_error(status, mask_secrets(exc.message))


async def _service_error(request: Request, exc: Exception) -> Response:
    settings = get_settings()
    if isinstance(exc, RedisError):
        where = f"Redis at {settings.redis_url_masked}"
    else:
        where = f"Postgres at {settings.database_url_masked}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    log.warning("%s %s: cannot use %s: %s", request.method, request.url.path, where, mask_secrets(text))
    return json_error(503, f"cannot use {where}; try again shortly")


async def _refused_data(request: Request, exc: Exception) -> Response:
    # The producer checks what Postgres cannot store and names the field; this is the backstop
    # for a value it let through: the request's data, not a server fault, and no retry helps.
    if is_outage(exc):
        return await _service_error(request, exc)
    message = refusal_message(exc, "the request")
    log.warning("%s %s: %s", request.method, request.url.path, message)
    return json_error(422, message)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises the exception after this response, so the server logs its traceback.
    return json_error(500, "internal error; the gateway log has the details")


class LoopbackHostGuard:
    """For an unauthenticated gateway: answer only requests addressed to localhost (no DNS rebinding)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if not host_header_is_loopback(host):
                response = json_error(403, "this unauthenticated gateway only answers requests for localhost")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: GatewaySettings) -> Starlette:
    """The gateway app for these settings."""
    gateway = Gateway(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway.closing = anyio.Event()
        try:
            yield
        finally:
            gateway.begin_shutdown()
            await gateway.close()

    routes = [
        Route("/", page, methods=["GET"], include_in_schema=False),
        Route("/favicon.svg", favicon, methods=["GET"], include_in_schema=False),
        Route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
        Route("/sessions", create_session, methods=["POST"]),
        Route("/sessions", list_sessions, methods=["GET"]),
        Route("/sessions/{session_id}", show_session, methods=["GET"]),
        Route("/sessions/{session_id}", update_session, methods=["PATCH"]),
        Route("/sessions/{session_id}", delete_session, methods=["DELETE"]),
        Route("/sessions/{session_id}/turns", submit_turn, methods=["POST"]),
        Route("/sessions/{session_id}/turns", list_session_turns, methods=["GET"]),
        Route("/sessions/{session_id}/events", stream_session, methods=["GET"]),
        Route("/turns/{turn_id}", show_turn, methods=["GET"]),
        Route("/turns/{turn_id}/cancel", cancel_turn, methods=["POST"]),
        Route("/turns/{turn_id}/events", stream_turn, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: _http_error,
        ChatqError: _chatq_error,
        RedisError: _service_error,
        OperationalError: _service_error,
        InterfaceError: _service_error,
        DisconnectionError: _service_error,
        StatementError: _refused_data,
        UnicodeError: _refused_data,
        Exception: _internal_error,
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.gateway = gateway
    if settings.unauthenticated:
        app.add_middleware(LoopbackHostGuard)
    return app
