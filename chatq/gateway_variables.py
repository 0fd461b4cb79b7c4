"""The gateway's variables (`GatewayVariables`): parsed by `load_gateway_variables()` when `chatq serve`
starts, apart from `chatq.settings.Settings`, so that a bad one stops the gateway only and never a
worker or another command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from chatq.env_values import env_float, env_int
from chatq.envfile import resolved_environ
from chatq.errors import ConfigError
from chatq.tenants import TENANT_RULE, is_tenant_name

__all__ = [
    "MIN_TOKEN_CHARS",
    "PLACEHOLDER_PREFIX",
    "GatewayVariables",
    "TenantToken",
    "load_gateway_variables",
    "parse_api_tokens",
    "parse_tenant_tokens",
    "placeholder_api_token",
]


PLACEHOLDER_PREFIX = "change-me"
"""How every secret in `.env.example` starts: a value that must be replaced before use."""

MIN_TOKEN_CHARS = 16
"""Shorter gateway tokens are refused: a guessable token is no authentication."""


@dataclass(frozen=True, kw_only=True)
class TenantToken:
    """One entry of `CHATQ_API_TOKENS`: a gateway token that sees only its tenant's sessions."""

    tenant: str
    """The tenant's name (stored on the sessions its token creates)."""
    token: str = field(repr=False)
    """The bearer token; never logged."""


@dataclass(frozen=True, kw_only=True)
class GatewayVariables:
    """The variables only `chatq serve` reads (`load_gateway_variables`), apart from `Settings` so that a
    bad one stops the gateway at its start and never a worker or another command."""

    api_tokens: tuple[str, ...] = field(default=(), repr=False)
    """Admin bearer tokens: every session (`CHATQ_API_TOKEN`, comma-separated to rotate); never logged."""
    tenant_tokens: tuple[TenantToken, ...] = field(default=(), repr=False)
    """Scoped tokens, each of one tenant (`CHATQ_API_TOKENS`, `tenant:token,...`); never logged."""
    api_max_body_bytes: int | None = None
    """Largest accepted request body (`CHATQ_API_MAX_BODY_BYTES`); None: the largest valid turn."""
    sse_heartbeat: float = 15.0
    """Seconds between heartbeat comments on an idle event stream (`CHATQ_SSE_HEARTBEAT`)."""


def parse_api_tokens(raw: str) -> tuple[str, ...]:
    """Tokens from `CHATQ_API_TOKEN` (comma-separated); ConfigError naming the problem, never the token."""
    tokens = tuple(part.strip() for part in raw.split(",") if part.strip())
    for number, token in enumerate(tokens, start=1):
        where = f"token {number} of CHATQ_API_TOKEN" if len(tokens) > 1 else "CHATQ_API_TOKEN"
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{where} is shorter than {MIN_TOKEN_CHARS} characters; use a long random value")
        if not token.isascii() or not token.isprintable() or " " in token:
            raise ConfigError(f"{where} must be printable ASCII without spaces")
    return tokens


def parse_tenant_tokens(raw: str, name: str = "CHATQ_API_TOKENS") -> tuple[TenantToken, ...]:
    """`tenant:token` pairs, comma-separated (a tenant may have several tokens, to rotate them).

    ConfigError naming the entry and the problem, never the token. Tenant names follow the one
    rule of `chatq.tenants`; tokens follow CHATQ_API_TOKEN's rules; a token may belong to
    one tenant only.
    """
    entries: list[TenantToken] = []
    seen: dict[str, str] = {}
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    for number, part in enumerate(parts, start=1):
        tenant, colon, token = part.partition(":")
        tenant, token = tenant.strip(), token.strip()
        where = f"entry {number} of {name}"
        if not colon or not is_tenant_name(tenant):
            raise ConfigError(f"{where} must be tenant:token, the tenant {TENANT_RULE} (e.g. acme:<token>)")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{where}: the token is shorter than {MIN_TOKEN_CHARS} characters; use a long random value"
            )
        if not token.isascii() or not token.isprintable() or " " in token:
            raise ConfigError(f"{where}: the token must be printable ASCII without spaces")
        if seen.get(token, tenant) != tenant:
            raise ConfigError(f"{where}: the same token is given to tenants {seen[token]!r} and {tenant!r}")
        seen[token] = tenant
        entries.append(TenantToken(tenant=tenant, token=token))
    return tuple(entries)


def load_gateway_variables(env: Mapping[str, str] | None = None, *, token_required: bool = True) -> GatewayVariables:
    """Parse and validate the gateway's variables from `env` (the process environment by default);
    without a token, ConfigError unless `token_required` is off (`chatq serve --unauthenticated`)."""
    env = resolved_environ() if env is None else env
    tokens = parse_api_tokens(env.get("CHATQ_API_TOKEN") or "")
    tenant_tokens = parse_tenant_tokens(env.get("CHATQ_API_TOKENS") or "")
    if not tokens and not tenant_tokens and token_required:
        raise ConfigError(
            "set CHATQ_API_TOKEN to a long random token (e.g. `openssl rand -hex 32`) or CHATQ_API_TOKENS to "
            "tenant:token pairs, or run `chatq serve --unauthenticated` on a loopback address"
        )
    if set(tokens) & {entry.token for entry in tenant_tokens}:
        raise ConfigError("a token of CHATQ_API_TOKENS is also in CHATQ_API_TOKEN: give each tenant its own token")
    max_body = None
    if (env.get("CHATQ_API_MAX_BODY_BYTES") or "").strip():
        max_body = env_int(env, "CHATQ_API_MAX_BODY_BYTES", 0, minimum=1024)
    return GatewayVariables(
        api_tokens=tokens,
        tenant_tokens=tenant_tokens,
        api_max_body_bytes=max_body,
        sse_heartbeat=env_float(env, "CHATQ_SSE_HEARTBEAT", 15.0, minimum=0.1, maximum=300.0),
    )


def placeholder_api_token(env: Mapping[str, str] | None = None) -> bool:
    """Whether `CHATQ_API_TOKEN` still holds `.env.example`'s public `change-me-...` value."""
    env = resolved_environ() if env is None else env
    tokens = (env.get("CHATQ_API_TOKEN") or "").split(",")
    return any(token.strip().lower().startswith(PLACEHOLDER_PREFIX) for token in tokens)
