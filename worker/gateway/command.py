"""`chatq serve`: registered through `worker.cli.commands.COMMAND_MODULES` (standard library only at import)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def refuse_placeholder_token(env: Mapping[str, str] | None = None) -> None:
    """ConfigError if CHATQ_API_TOKEN still holds the `change-me-...` value `.env.example` ships:
    that token is public, so a gateway accepting it would be open to anyone who read the example."""
    from chatq.gateway_variables import placeholder_api_token
    from worker.errors import ConfigError
    from worker.gateway.config import TOKEN_ENV

    if placeholder_api_token(env):
        raise ConfigError(
            f"{TOKEN_ENV} still holds the placeholder from .env.example; "
            "set a long random token (e.g. `openssl rand -hex 32`)"
        )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `chatq serve`."""
    serve = subparsers.add_parser(
        "serve",
        help="run the HTTP gateway: producer API, Server-Sent Events, chat page at /",
        description=(
            "Serve the chatq HTTP gateway with uvicorn. Clients authenticate with the bearer token in "
            "CHATQ_API_TOKEN; without one the gateway refuses to start unless --unauthenticated is given "
            "with a loopback --host."
        ),
    )
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    serve.add_argument(
        "--unauthenticated",
        action="store_true",
        help="serve without a token (loopback addresses only; for trying chatq on your own machine)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"], help="uvicorn's"
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        default=None,
        metavar="IPS",
        help="proxies trusted for X-Forwarded-* headers (uvicorn's option; default: 127.0.0.1)",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from worker.gateway.server import serve
    from worker.schema import require_schema

    refuse_placeholder_token()
    require_schema(args.settings)
    return serve(
        host=args.host,
        port=args.port,
        unauthenticated=args.unauthenticated,
        log_level=args.log_level,
        forwarded_allow_ips=args.forwarded_allow_ips,
    )
