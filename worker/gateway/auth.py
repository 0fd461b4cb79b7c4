"""Bearer-token authentication and the loopback guard of an unauthenticated gateway.

Clients send `Authorization: Bearer <token>`. The browser's `EventSource` cannot send headers,
so GET event streams (and only those) also accept `?access_token=<token>`. Tokens are compared
with `hmac.compare_digest` against every configured token, so timing tells nothing.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
"""Host names an unauthenticated gateway may listen on and answer for."""

QUERY_TOKEN = "access_token"
"""Query parameter carrying the token on GET event streams (EventSource sends no headers)."""


def is_loopback(host: str) -> bool:
    """True for a loopback listen address or host name (localhost, 127.0.0.0/8, ::1)."""
    name = host.strip().lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def host_header_is_loopback(host_header: str) -> bool:
    """True when a Host header names the local machine (guards an open gateway against DNS rebinding)."""
    value = host_header.strip().lower()
    if value.startswith("["):
        name = value[1 : value.find("]")] if "]" in value else value
    else:
        name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return is_loopback(name)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer ...` header, or None."""
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


ADMIN = "*"
"""What `match_token` returns for an admin token (`CHATQ_API_TOKEN`): every session."""


def match_token(candidate: str | None, admin: Iterable[str], scoped: Iterable[tuple[str, str]]) -> str | None:
    """The tenant of a scoped token (`(tenant, token)` pairs), ADMIN for an admin token, None for no match.

    Constant time in the candidate: every configured token is compared, with no early exit.
    """
    if candidate is None:
        return None
    given = candidate.encode("utf-8", "surrogateescape")
    found: str | None = None
    for token in admin:
        if hmac.compare_digest(given, token.encode("utf-8")):
            found = ADMIN
    for tenant, token in scoped:
        if hmac.compare_digest(given, token.encode("utf-8")):
            found = tenant
    return found


def token_matches(candidate: str | None, tokens: Iterable[str]) -> bool:
    """Constant-time comparison against every accepted token (no early exit)."""
    if candidate is None:
        return False
    given = candidate.encode("utf-8", "surrogateescape")
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(given, token.encode("utf-8"))
    return matched
