"""The gateway's public endpoints: the chat page, its icon, and the health checks."""

from __future__ import annotations

import html

from starlette.responses import JSONResponse, Response

from worker.gateway.routing import Call
from worker.gateway.sessions_api import DEFAULT_FRAMEWORK

__all__ = ["favicon", "framework_options", "healthz", "page", "readyz"]

FRAMEWORKS_MARK = b"<!-- frameworks -->"
"""Where the page's framework <select> gets its options."""

FAVICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    b'<rect width="32" height="32" rx="7" fill="#3b6fd8"/>'
    b'<path d="M8 10h16v10H14l-5 4v-4H8z" fill="#fff"/></svg>'
)
"""The page's icon: a speech bubble, served so that browsers asking for one get no 404."""

_SERVICE_NAMES = {"postgres": "Postgres", "redis": "Redis"}


def framework_options() -> bytes:
    """The page's framework choices, from the framework registry (a new framework shows up by itself)."""
    from handlers import framework_choices

    options = [
        f'<option value="{html.escape(value)}"{" selected" if value == DEFAULT_FRAMEWORK else ""}>'
        f"{html.escape(label)}</option>"
        for value, label in framework_choices()
    ]
    return "".join(options).encode("utf-8")


async def page(call: Call) -> Response:
    """The chat page."""
    gateway = call.gateway
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


async def favicon(call: Call) -> Response:
    """The page's icon."""
    return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "public, max-age=86400"})


async def healthz(call: Call) -> Response:
    """Liveness of the gateway process (no Redis or Postgres round trip)."""
    return JSONResponse({"status": "ok"})


async def readyz(call: Call) -> Response:
    """Readiness: whether Postgres and Redis both answer, each checked within two seconds."""
    checks = await call.gateway.readiness()
    down = [_SERVICE_NAMES[name] for name, state in checks.items() if state != "ok"]
    if not down:
        return JSONResponse({"status": "ready", **checks})
    error = f"not ready: {' and '.join(down)} {'does' if len(down) == 1 else 'do'} not answer"
    return JSONResponse({"status": "not ready", **checks, "error": error}, status_code=503)
