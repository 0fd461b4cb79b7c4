"""The gateway's ASGI app (Starlette): `create_app(settings)`.

Postgres calls and the Celery send run in Starlette's thread pool; Redis is used through
`redis.asyncio`, so a thousand idle event streams cost a thousand sockets, not a thousand threads.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.resources
import json
import logging
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator
from starlette.types import ASGIApp, Receive, Scope, Send

from worker.config import get_settings, mask_secrets
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
from worker.events import turn_stream
from worker.gateway import store
from worker.gateway.auth import QUERY_TOKEN, bearer_token, host_header_is_loopback, token_matches
from worker.gateway.config import GatewaySettings
from worker.gateway.openapi import BASE_SCHEMA
from worker.gateway.sse import (
    FINISHED_STATUSES,
    RETRY_MS,
    EventStreamResponse,
    SessionCursor,
    encode_frame,
    encode_retry,
    event_seq,
    is_terminal,
    parse_event,
    parse_last_event_id,
    session_events,
    terminal_from_report,
    turn_events,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_ERROR_STATUS: dict[type[ChatqError], int] = {
    InvalidTurn: 422,
    SessionNotFound: 404,
    TurnNotFound: 404,
    SessionBusy: 409,
    TurnConflict: 409,
    NotCancellable: 409,
    ServiceUnavailable: 503,
}

SESSION_FIELDS = frozenset({"framework", "model", "system_prompt", "metadata"})
TURN_FIELDS = frozenset({"content", "images", "reply_to", "turn_id", "if_busy"})


# ------------------------------------------------------------------------------------ the state


class Gateway:
    """What the endpoints share: settings, the async Redis client, the page."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._redis: aioredis.Redis | None = None
        self.page, self.page_csp = load_page()
        self.closing: anyio.Event | None = None
        """Set when the server shuts down: event streams end cleanly (created at start-up)."""

    def begin_shutdown(self) -> None:
        """End every open event stream (call on the event loop)."""
        if self.closing is not None:
            self.closing.set()

    def redis(self) -> aioredis.Redis:
        """The app's async Redis client (created on first use; blocking reads stay under its socket timeout)."""
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                get_settings().redis_url,
                decode_responses=True,
                socket_connect_timeout=2,
                socket_timeout=self.settings.heartbeat + 10,
                health_check_interval=30,
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
            )
        return self._redis

    async def close(self) -> None:
        """Close the Redis client."""
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    def authorize(self, request: Request, *, query_ok: bool = False) -> None:
        """Raise 401 unless the request carries an accepted token (a query token only where allowed)."""
        if self.settings.unauthenticated:
            return
        token = bearer_token(request.headers)
        if token is None and query_ok:
            token = request.query_params.get(QUERY_TOKEN)
        if not token_matches(token, self.settings.tokens):
            where = "an Authorization: Bearer header" + (" or ?access_token=" if query_ok else "")
            message = "missing bearer token" if token is None else "wrong bearer token"
            raise HTTPException(
                401, f"{message}: send CHATQ_API_TOKEN in {where}", headers={"WWW-Authenticate": 'Bearer realm="chatq"'}
            )

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The request body as a JSON object: 413 over the size limit, 415 if not JSON, 422 if malformed."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise HTTPException(413, f"request body is over {limit} bytes (CHATQ_API_MAX_BODY_BYTES)")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HTTPException(413, f"request body is over {limit} bytes (CHATQ_API_MAX_BODY_BYTES)")
        if not body.strip():
            return {}
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise HTTPException(415, "send the request body as JSON with Content-Type: application/json")
        try:
            data = json.loads(bytes(body))
        except ValueError as exc:
            raise HTTPException(422, f"request body is not valid JSON: {str(exc).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise HTTPException(422, f"request body must be a JSON object, got {type(data).__name__}")
        return data


def gateway_of(request: Request) -> Gateway:
    gateway = request.app.state.gateway
    assert isinstance(gateway, Gateway)
    return gateway


_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
_STYLE = re.compile(r"<style>(.*?)</style>", re.DOTALL)


def load_page() -> tuple[bytes, str]:
    """The chat page and its Content-Security-Policy (its inline script and style allowed by hash)."""
    text = importlib.resources.files("worker.gateway").joinpath("page.html").read_text(encoding="utf-8")

    def digest(pattern: re.Pattern[str]) -> str:
        hashes = [
            "'sha256-" + base64.b64encode(hashlib.sha256(m.encode()).digest()).decode() + "'"
            for m in pattern.findall(text)
        ]
        return " ".join(hashes) or "'none'"

    csp = (
        f"default-src 'none'; script-src {digest(_SCRIPT)}; style-src {digest(_STYLE)}; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return text.encode("utf-8"), csp


# ------------------------------------------------------------------------------------- helpers


def path_uuid(request: Request, name: str, kind: str) -> uuid.UUID:
    """A UUID path parameter; 404 (no such thing) if it is not a UUID."""
    raw = str(request.path_params[name])
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise HTTPException(404, f"no such {kind}: {raw[:60]!r} is not a UUID") from None


def last_event_id(request: Request) -> str | None:
    """Last-Event-ID from the header (what EventSource sends on reconnect) or `?last_event_id=`."""
    value = request.headers.get("last-event-id")
    if value is None or not value.strip():
        value = request.query_params.get("last_event_id")
    return value if value is not None and value.strip() else None


def check_fields(data: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise HTTPException(
            422, f"unknown field(s): {', '.join(unknown)}; expected some of: {', '.join(sorted(allowed))}"
        )


def optional_str(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise HTTPException(422, f"{name} must be a string or null, got {type(value).__name__}")
    return value


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def threaded(function: Callable[..., T], *args: Any) -> T:
    """Run a blocking call (Postgres, the Celery send) in the thread pool."""
    return await run_in_threadpool(function, *args)


# ----------------------------------------------------------------------------------- endpoints


async def page(request: Request) -> Response:
    gateway = gateway_of(request)
    return Response(
        gateway.page,
        media_type="text/html",
        headers={
            "Content-Security-Policy": gateway.page_csp,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


async def healthz(request: Request) -> Response:
    """Liveness of the gateway process (no Redis or Postgres round trip).
    ---
    summary: Liveness check
    security: []
    responses:
      "200":
        description: the gateway answers
        content:
          application/json:
            schema: {type: object, properties: {status: {type: string, enum: [ok]}}}
    """
    return JSONResponse({"status": "ok"})


async def openapi(request: Request) -> Response:
    return JSONResponse(SchemaGenerator(BASE_SCHEMA).get_schema(routes=request.app.routes))


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
    gateway.authorize(request)
    data = await gateway.read_json(request)
    check_fields(data, SESSION_FIELDS)
    framework = data.get("framework", "langgraph")
    if not isinstance(framework, str):
        raise HTTPException(422, f"framework must be a string, got {type(framework).__name__}")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise HTTPException(422, f"metadata must be an object or null, got {type(metadata).__name__}")
    model, system_prompt = optional_str(data, "model"), optional_str(data, "system_prompt")

    def run() -> uuid.UUID:
        return create(framework=framework, model=model, system_prompt=system_prompt, metadata=metadata)

    session_id = await threaded(run)
    links = {"turns": f"/sessions/{session_id}/turns", "events": f"/sessions/{session_id}/events"}
    return JSONResponse(
        {"session_id": str(session_id), "links": links},
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
        description: the turn is queued
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
    from worker.producer import SubmittedTurn
    from worker.producer import submit_turn as submit

    gateway = gateway_of(request)
    gateway.authorize(request)
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

    def run() -> SubmittedTurn:
        return submit(session_id, content, images=images, reply_to=reply_to, turn_id=turn_id, if_busy=if_busy)

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

    gateway_of(request).authorize(request)
    turn_id = path_uuid(request, "turn_id", "turn")
    return JSONResponse(await threaded(turn_report, turn_id))


async def cancel_turn(request: Request) -> Response:
    """Cancel a queued or running turn.
    ---
    summary: Cancel a turn
    description: >-
      A queued turn ends `cancelled` at once; a running one is asked to stop (status `running` here,
      then its `cancelled` event within about a second).
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
    from worker.producer import cancel_turn as cancel

    gateway_of(request).authorize(request)
    turn_id = path_uuid(request, "turn_id", "turn")
    status = await threaded(cancel, turn_id)
    return JSONResponse({"turn_id": str(turn_id), "status": status.value})


async def stream_turn(request: Request) -> Response:
    """The events of one turn as Server-Sent Events, from its first event to its terminal one.
    ---
    summary: Stream a turn's events (SSE)
    description: >-
      Each message has `id:` = the event's `seq` and `data:` = the event's JSON. With
      `Last-Event-ID: N` (EventSource sends it when it reconnects) the stream resumes after event N
      with nothing lost or repeated. The stream closes after the `final`, `error` or `cancelled`
      event; a reconnect after that gets 204 (which tells EventSource to stop). If the turn's replay
      stream has expired, its terminal event is rebuilt from Postgres (`"seq": null`, `"source": "postgres"`).
    tags: [events]
    security: [{bearer: []}, {accessToken: []}]
    parameters:
      - {$ref: "#/components/parameters/TurnId"}
      - {$ref: "#/components/parameters/LastEventIdHeader"}
      - {$ref: "#/components/parameters/LastEventIdQuery"}
      - {$ref: "#/components/parameters/AccessToken"}
    responses:
      "200": {$ref: "#/components/responses/EventStream"}
      "204": {description: the turn ended at or before Last-Event-ID}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.queries import turn_report

    gateway = gateway_of(request)
    gateway.authorize(request, query_ok=True)
    turn_id = path_uuid(request, "turn_id", "turn")
    raw_after = last_event_id(request)
    try:
        after = parse_last_event_id(raw_after) if raw_after is not None else 0
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    client = gateway.redis()
    newest: Any = await client.xrevrange(turn_stream(turn_id), count=1)
    if newest:
        event = parse_event(newest[0][1].get("event"))
        seq = event_seq(event) if event else None
        if event and is_terminal(event) and seq is not None and raw_after is not None and seq == after:
            return Response(status_code=204)  # the client has the terminal event: EventSource stops
    else:
        if not await threaded(store.turn_exists, turn_id):
            raise HTTPException(404, f"no such turn: {turn_id}")
        report = await threaded(turn_report, turn_id)
        if report["status"] in FINISHED_STATUSES:
            frame = json.dumps(terminal_from_report(report), separators=(",", ":"))
            return EventStreamResponse(_single(frame), closing=gateway.closing)

    async def load_report() -> dict[str, Any] | None:
        try:
            return await threaded(turn_report, turn_id)
        except TurnNotFound:
            return None

    frames = turn_events(
        client, str(turn_id), after=after, heartbeat=gateway.settings.heartbeat, load_report=load_report
    )
    return EventStreamResponse(frames, closing=gateway.closing)


async def _single(data: str) -> AsyncGenerator[bytes, None]:
    yield encode_retry(RETRY_MS)
    yield encode_frame(data)


async def stream_session(request: Request) -> Response:
    """The events of every turn of a session as Server-Sent Events, live.
    ---
    summary: Stream a session's events (SSE)
    description: >-
      A new stream starts with the session's unfinished turns from their first event (so a page
      opened mid-reply sees the whole reply), then follows the session live; it never ends by itself.
      Each message's `id:` is a cursor `W:S[,P:S]...` (turn positions with the last `seq` delivered;
      turns before position W are complete). Reconnecting with it as `Last-Event-ID` resumes with
      nothing lost or repeated, as long as the turns' replay streams are kept (CHATQ_EVENT_RETENTION).
    tags: [events]
    security: [{bearer: []}, {accessToken: []}]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
      - {$ref: "#/components/parameters/LastEventIdHeader"}
      - {$ref: "#/components/parameters/LastEventIdQuery"}
      - {$ref: "#/components/parameters/AccessToken"}
    responses:
      "200": {$ref: "#/components/responses/EventStream"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    gateway = gateway_of(request)
    gateway.authorize(request, query_ok=True)
    session_id = path_uuid(request, "session_id", "session")
    raw_cursor = last_event_id(request)
    try:
        cursor = SessionCursor.parse(raw_cursor) if raw_cursor is not None else None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    if not await threaded(store.session_exists, session_id):
        raise HTTPException(404, f"no such session: {session_id}")
    client = gateway.redis()

    async def initial_cursor() -> SessionCursor:
        start, recent = await threaded(store.session_start, session_id)
        for turn_id, position in recent:
            newest: Any = await client.xrevrange(turn_stream(turn_id), count=1)
            event = parse_event(newest[0][1].get("event")) if newest else None
            if newest and (event is None or not is_terminal(event)):
                # Finished in Postgres, but its terminal event is not out yet: start with it.
                start = min(start, position)
                break
        return SessionCursor(watermark=start)

    async def turns_from(position: int) -> list[tuple[str, int]]:
        return await threaded(store.turns_from, session_id, position)

    async def position_of(turn_id: str) -> int | None:
        return await threaded(store.position_of, session_id, turn_id)

    frames = session_events(
        client,
        str(session_id),
        cursor=cursor,
        heartbeat=gateway.settings.heartbeat,
        initial_cursor=initial_cursor,
        turns_from=turns_from,
        position_of=position_of,
    )
    return EventStreamResponse(frames, closing=gateway.closing)


# ------------------------------------------------------------------------------ errors, the app


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
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False),
        Route("/sessions", create_session, methods=["POST"]),
        Route("/sessions/{session_id}/turns", submit_turn, methods=["POST"]),
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
        Exception: _internal_error,
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.gateway = gateway
    if settings.unauthenticated:
        app.add_middleware(LoopbackHostGuard)
    return app
