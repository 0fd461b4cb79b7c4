"""The gateway's configuration: its variables (parsed in `chatq.gateway_variables`) adapted to what it serves.

| variable | default | meaning |
|---|---|---|
| `CHATQ_API_TOKEN` | — (this or the next required) | admin bearer token(s): every session; comma-separated to rotate |
| `CHATQ_API_TOKENS` | — | scoped tokens `tenant:token,...`: each sees its tenant's sessions |
| `CHATQ_API_MAX_BODY_BYTES` | largest valid turn | bigger request bodies are refused with 413 |
| `CHATQ_SSE_HEARTBEAT` | `15` | seconds between SSE comment lines on an idle stream |

Only `chatq serve` reads them (`chatq.gateway_variables.load_gateway_variables`), so a bad one stops the gateway
at its start and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from chatq.gateway_variables import TenantToken, load_gateway_variables
from chatq.settings import Settings

TOKEN_ENV = "CHATQ_API_TOKEN"
MAX_BODY_ENV = "CHATQ_API_MAX_BODY_BYTES"
HEARTBEAT_ENV = "CHATQ_SSE_HEARTBEAT"

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


def load_gateway_settings(
    env: Mapping[str, str] | None = None, *, settings: Settings, unauthenticated: bool = False
) -> GatewaySettings:
    """The gateway's variables (from `env`, the process environment by default) over `settings`;
    ConfigError (one line) for a bad value or a missing token."""
    variables = load_gateway_variables(env, token_required=not unauthenticated)
    max_body = variables.api_max_body_bytes
    return GatewaySettings(
        tokens=() if unauthenticated else variables.api_tokens,
        tenant_tokens=() if unauthenticated else variables.tenant_tokens,
        max_body_bytes=max_body if max_body is not None else largest_valid_body(settings),
        heartbeat=variables.sse_heartbeat,
        unauthenticated=unauthenticated,
    )
