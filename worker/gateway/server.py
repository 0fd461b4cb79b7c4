"""Running the gateway under uvicorn, with its start-up checks and a token-free access log."""

from __future__ import annotations

import logging
import re
import socket
import sys
from urllib.parse import unquote_plus

import uvicorn

from chatq.settings import get_settings
from worker.errors import ConfigError
from worker.gateway.app import create_app
from worker.gateway.auth import QUERY_TOKEN, is_loopback
from worker.gateway.config import load_gateway_settings
from worker.gateway.state import Gateway
from worker.ops.logs import configure_filters

GRACEFUL_SHUTDOWN_SECONDS = 5
"""How long shutdown waits for requests in flight (event streams are ended at once, cleanly)."""

_QUERY_PARAMETER = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;#\s]*)=(?P<value>[^&;#\s]*)")


def redact_query_token(text: str) -> str:
    """Replace the value of any `access_token=` query parameter, however its name is percent-encoded.

    Starlette decodes parameter names before the gateway looks them up, so `?access%5Ftoken=...`
    authenticates as well as `?access_token=...` does: the name is compared after decoding too.
    """

    def redact(match: re.Match[str]) -> str:
        if unquote_plus(match["name"]).strip().lower() != QUERY_TOKEN:
            return match.group()
        return f"{match['lead']}{match['name']}=***"

    return _QUERY_PARAMETER.sub(redact, text) if "=" in text else text


class RedactTokens(logging.Filter):
    """Keeps `?access_token=` values out of uvicorn's access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query_token(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = redact_query_token(record.msg)
        return True


def mask_server_logs() -> None:
    """Mask secrets in every line the gateway process writes (uvicorn's and chatq's own).

    uvicorn logs tracebacks of unexpected errors, and chatq's modules log to the root logger:
    each handler gets chatq's filter (`worker.ops.logs.TurnContextFilter`: configured secret values and
    URL passwords masked, tracebacks included); the root logger gets a stderr handler if it has none.
    """
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        root.addHandler(handler)
    # Not uvicorn.access: its formatter needs the record's arguments, and RedactTokens covers it.
    for name in ("", "uvicorn", "uvicorn.error"):
        configure_filters(logging.getLogger(name))


class GatewayServer(uvicorn.Server):
    """uvicorn's server, ending the gateway's event streams as soon as shutdown begins.

    Event streams never end by themselves; without this, shutdown would wait out its timeout and
    then cut them mid-response. Clients reconnect with Last-Event-ID and lose nothing either way.
    """

    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self.gateway = gateway

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.gateway.begin_shutdown()
        await super().shutdown(sockets=sockets)


def serve(
    *,
    host: str,
    port: int,
    unauthenticated: bool,
    log_level: str = "info",
    forwarded_allow_ips: str | None = None,
) -> int:
    """Check the configuration, then serve until interrupted. ConfigError (one line) for a bad set-up."""
    if unauthenticated and not is_loopback(host):
        raise ConfigError(
            f"--unauthenticated serves anyone who can connect, so it only listens on loopback; got --host {host}"
        )
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    chatq = get_settings()  # the gateway's edge: read once, handed down
    settings = load_gateway_settings(unauthenticated=unauthenticated, settings=chatq)
    app = create_app(settings, chatq=chatq)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        forwarded_allow_ips=forwarded_allow_ips,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        server_header=False,
    )
    logging.getLogger("uvicorn.access").addFilter(RedactTokens())
    mask_server_logs()
    mode = "WITHOUT authentication (loopback only)" if unauthenticated else "bearer token required"
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"chatq gateway: http://{shown}:{port}/ ({mode}); API at /openapi.json\n")
    sys.stderr.flush()
    GatewayServer(config, app.state.gateway).run()
    return 0
