"""The gateway's ASGI app (Starlette): `create_app(settings)`, with the routes of `worker/gateway/routes.py`.

Postgres calls and the Celery send run in Starlette's thread pool; Redis is used through
`redis.asyncio`, so a thousand idle event streams cost a thousand sockets, not a thousand threads.
Errors become one-line JSON bodies here, whichever endpoint raised them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from redis.exceptions import RedisError
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, StatementError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from chatq.masking import mask_secrets
from chatq.settings import Settings
from models.errors import KnowledgeBaseNotFound
from worker.errors import (
    ApprovalConflict,
    ApprovalExpired,
    ChatqError,
    InvalidTurn,
    NotCancellable,
    ScheduleNotFound,
    ServiceUnavailable,
    SessionBusy,
    SessionNotFound,
    TurnConflict,
    TurnNotFound,
)
from worker.gateway.auth import host_header_is_loopback
from worker.gateway.config import GatewaySettings
from worker.gateway.routes import ROUTES
from worker.gateway.sessions_api import DEFAULT_FRAMEWORK
from worker.gateway.site import framework_options
from worker.gateway.state import Gateway, gateway_of, json_error
from worker.storable import is_outage, refusal_message

__all__ = ["DEFAULT_FRAMEWORK", "LoopbackHostGuard", "create_app", "framework_options"]

log = logging.getLogger(__name__)

_ERROR_STATUS: dict[type[ChatqError], int] = {
    InvalidTurn: 422,
    SessionNotFound: 404,
    TurnNotFound: 404,
    ScheduleNotFound: 404,
    SessionBusy: 409,
    TurnConflict: 409,
    NotCancellable: 409,
    ApprovalConflict: 409,
    ApprovalExpired: 410,
    ServiceUnavailable: 503,
    KnowledgeBaseNotFound: 422,
}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers) if exc.headers else None
    return json_error(exc.status_code, str(exc.detail), headers)


async def _chatq_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ChatqError)
    status = next((code for kind, code in _ERROR_STATUS.items() if isinstance(exc, kind)), 500)
    return json_error(status, mask_secrets(exc.message))


async def _service_error(request: Request, exc: Exception) -> Response:
    settings = gateway_of(request).chatq
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


def create_app(settings: GatewaySettings, *, chatq: Settings) -> Starlette:
    """The gateway app for these settings, over chatq's (`chatq`, read by the caller)."""
    gateway = Gateway(settings, chatq)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway.closing = anyio.Event()
        try:
            yield
        finally:
            gateway.begin_shutdown()
            await gateway.close()

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
    app = Starlette(routes=[endpoint.route() for endpoint in ROUTES], exception_handlers=handlers, lifespan=lifespan)
    app.state.gateway = gateway
    if settings.unauthenticated:
        app.add_middleware(LoopbackHostGuard)
    return app
