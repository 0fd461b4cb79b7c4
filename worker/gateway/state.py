"""What the gateway's endpoints share: the `Gateway` state (settings, async Redis, the page) and
small request helpers (path ids, Last-Event-ID, JSON field checks, error bodies, the thread pool).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from chatq.masking import mask_secrets
from chatq.settings import Settings
from worker.gateway.auth import ADMIN, QUERY_TOKEN, bearer_token, match_token
from worker.gateway.config import GatewaySettings

__all__ = [
    "Gateway",
    "check_fields",
    "gateway_of",
    "json_error",
    "last_event_id",
    "load_page",
    "optional_str",
    "path_uuid",
    "threaded",
]

T = TypeVar("T")
log = logging.getLogger(__name__)


READINESS_TIMEOUT = 2.0
"""Seconds each readiness check may take: a probe answers even when a service hangs."""


class Gateway:
    """What the endpoints share: settings, the async Redis client, the page."""

    def __init__(self, settings: GatewaySettings, chatq: Settings) -> None:
        self.settings = settings
        self.chatq = chatq
        """chatq's settings, read once by the edge that serves the app (`worker.gateway.server`)."""
        self._redis: aioredis.Redis | None = None
        self._probe_threads: anyio.CapacityLimiter | None = None
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
                self.chatq.redis_url,
                decode_responses=True,
                socket_connect_timeout=2,
                socket_timeout=self.settings.heartbeat + 10,
                health_check_interval=30,
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
            )
        return self._redis

    async def readiness(self) -> dict[str, str]:
        """Whether Postgres and Redis answer, checked side by side: "ok", or why not, for each."""
        states: dict[str, str] = {}

        async def check(name: str, probe: Callable[[], Awaitable[object]]) -> None:
            try:
                with anyio.fail_after(READINESS_TIMEOUT):
                    await probe()
            except TimeoutError:
                states[name] = f"no answer within {READINESS_TIMEOUT:g}s"
            except Exception as exc:  # whatever the failure, the gateway is not ready
                states[name] = f"error: {type(exc).__name__}"
                detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.warning("readiness check: %s does not answer: %s", name, mask_secrets(detail))
            else:
                states[name] = "ok"

        async with anyio.create_task_group() as group:
            group.start_soon(check, "postgres", self._ping_postgres)
            group.start_soon(check, "redis", self._ping_redis)
        return {"postgres": states["postgres"], "redis": states["redis"]}

    async def _ping_postgres(self) -> None:
        if self._probe_threads is None:
            self._probe_threads = anyio.CapacityLimiter(2)
        # Abandoned on timeout (its connect gives up after the engine's connect_timeout); the
        # limiter keeps a hung Postgres from piling up probe threads.
        await anyio.to_thread.run_sync(_select_one, abandon_on_cancel=True, limiter=self._probe_threads)

    async def _ping_redis(self) -> None:
        await self.redis().ping()

    async def close(self) -> None:
        """Close the Redis client."""
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    def authorize(self, request: Request, *, query_ok: bool = False) -> str | None:
        """The tenant the request's token is scoped to (None: an admin token, every session).

        Raises 401 unless the request carries an accepted token (a query token only where allowed).
        """
        if self.settings.unauthenticated:
            return None
        token = bearer_token(request.headers)
        if token is None and query_ok:
            token = request.query_params.get(QUERY_TOKEN)
        scoped = ((entry.tenant, entry.token) for entry in self.settings.tenant_tokens)
        tenant = match_token(token, self.settings.tokens, scoped)
        if tenant is not None:
            return None if tenant == ADMIN else tenant
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
        except RecursionError:
            # The parser recurses once per level: a small body can nest deeper than Python allows.
            raise HTTPException(422, "request body is nested too deeply to be a chatq request") from None
        if not isinstance(data, dict):
            raise HTTPException(422, f"request body must be a JSON object, got {type(data).__name__}")
        return data


def _select_one() -> None:
    from models.db import get_engine

    with get_engine().connect() as connection:
        connection.execute(text("SELECT 1"))


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
        # Names as the client sent them, escaped: a field name may hold anything JSON can.
        names = ", ".join(name if name.isprintable() and name.isascii() else ascii(name) for name in unknown[:10])
        raise HTTPException(422, f"unknown field(s): {names}; expected some of: {', '.join(sorted(allowed))}")


def optional_str(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise HTTPException(422, f"{name} must be a string or null, got {type(value).__name__}")
    return value


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    # A lone surrogate in a message would make the UTF-8 response itself fail: escape it instead.
    safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": safe}, status_code=status, headers=headers)


async def threaded(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (Postgres, the Celery send) in the thread pool."""
    return await run_in_threadpool(function, *args, **kwargs)
