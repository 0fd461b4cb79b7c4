"""The gateway's own environment variables, parsed and validated once at start.

They live here rather than in `chatq.settings` because only `chatq serve` reads them:

| variable | default | meaning |
|---|---|---|
| `CHATQ_API_TOKEN` | — (this or the next required) | admin bearer token(s): every session; comma-separated to rotate |
| `CHATQ_API_TOKENS` | — | scoped tokens `tenant:token,...` (in `chatq.settings`): each sees its tenant's sessions |
| `CHATQ_API_MAX_BODY_BYTES` | largest valid turn | bigger request bodies are refused with 413 |
| `CHATQ_SSE_HEARTBEAT` | `15` | seconds between SSE comment lines on an idle stream |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from chatq.settings import Settings, TenantToken, env_float, env_int, get_settings
from worker.errors import ConfigError

TOKEN_ENV = "CHATQ_API_TOKEN"
MAX_BODY_ENV = "CHATQ_API_MAX_BODY_BYTES"
HEARTBEAT_ENV = "CHATQ_SSE_HEARTBEAT"

MIN_TOKEN_CHARS = 16
"""Shorter tokens are refused: a guessable token is no authentication."""

JSON_OVERHEAD_BYTES = 64 * 1024
"""Room for the JSON around the content and images of the largest valid turn."""


def largest_valid_body(settings: Settings) -> int:
    """Bytes of the largest request a valid turn can need.

    Text: every character may be a 6-byte JSON escape. Images: base64 data URLs (4/3 of the
    decoded size) at the configured count and size. The default limit is this, so no turn the
    worker would accept is refused at the door.
    """
    text = 6 * settings.max_content_chars
    images = settings.max_images * (-(-settings.max_image_bytes * 4 // 3) + 200)
    return text + images + JSON_OVERHEAD_BYTES


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """Validated gateway configuration."""

    tokens: tuple[str, ...] = field(default=(), repr=False)
    """Accepted admin bearer tokens (`CHATQ_API_TOKEN`): every session; never logged."""
    tenant_tokens: tuple[TenantToken, ...] = field(default=(), repr=False)
    """Scoped tokens (`CHATQ_API_TOKENS`): each sees only its tenant's sessions; never logged."""
    max_body_bytes: int = 1_000_000
    """Largest accepted request body (`CHATQ_API_MAX_BODY_BYTES`)."""
    heartbeat: float = 15.0
    """Seconds between heartbeat comments on an idle event stream (`CHATQ_SSE_HEARTBEAT`)."""
    unauthenticated: bool = False
    """Serve without tokens (`chatq serve --unauthenticated`, loopback only)."""


def parse_tokens(raw: str) -> tuple[str, ...]:
    """Tokens from `CHATQ_API_TOKEN` (comma-separated); ConfigError naming the problem, never the token."""
    tokens = tuple(part.strip() for part in raw.split(",") if part.strip())
    for number, token in enumerate(tokens, start=1):
        where = f"token {number} of {TOKEN_ENV}" if len(tokens) > 1 else TOKEN_ENV
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{where} is shorter than {MIN_TOKEN_CHARS} characters; use a long random value")
        if not token.isascii() or not token.isprintable() or " " in token:
            raise ConfigError(f"{where} must be printable ASCII without spaces")
    return tokens


def load_gateway_settings(
    env: Mapping[str, str] | None = None, *, unauthenticated: bool = False, settings: Settings | None = None
) -> GatewaySettings:
    """Parse the gateway's variables; ConfigError (one line) for a bad value or a missing token."""
    env = os.environ if env is None else env
    settings = settings or get_settings()
    tokens = parse_tokens(env.get(TOKEN_ENV) or "")
    tenant_tokens = settings.api_tokens
    if not tokens and not tenant_tokens and not unauthenticated:
        raise ConfigError(
            f"set {TOKEN_ENV} to a long random token (e.g. `openssl rand -hex 32`) or CHATQ_API_TOKENS to "
            "tenant:token pairs, or run `chatq serve --unauthenticated` on a loopback address"
        )
    if set(tokens) & {entry.token for entry in tenant_tokens}:
        raise ConfigError(f"a token of CHATQ_API_TOKENS is also in {TOKEN_ENV}: give each tenant its own token")
    return GatewaySettings(
        tokens=() if unauthenticated else tokens,
        tenant_tokens=() if unauthenticated else tenant_tokens,
        max_body_bytes=env_int(env, MAX_BODY_ENV, largest_valid_body(settings), minimum=1024),
        heartbeat=env_float(env, HEARTBEAT_ENV, 15.0, minimum=0.1, maximum=300.0),
        unauthenticated=unauthenticated,
    )
