"""The one rule for a tenant's name, wherever a tenant is given: a gateway token's (`CHATQ_API_TOKENS`),
a session's from the Python API, the command line, a batch file or a raw task message.

A tenant owns sessions (and so their turns, usage, schedules and knowledge bases): a scoped
gateway token sees only its tenant's. Its name is 1 to 64 of letters, digits, `_`, `.` and `-`,
starting with a letter or a digit, so that it fits `chat_sessions.tenant` (64 characters) and
reads the same in a log line, a URL or a `tenant:token` pair (no `:` or `,`, no space).
"""

from __future__ import annotations

import re

from chatq.errors import InvalidTenant

__all__ = ["TENANT_NAME", "TENANT_RULE", "is_tenant_name", "validate_tenant"]

TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A whole tenant name (use `fullmatch`)."""

TENANT_RULE = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
"""The rule in words, for error lines."""


def is_tenant_name(name: object) -> bool:
    """Whether `name` is a valid tenant name (a string matching `TENANT_NAME` whole)."""
    return isinstance(name, str) and TENANT_NAME.fullmatch(name) is not None


def validate_tenant(name: object, what: str = "tenant") -> str:
    """`name` itself if it is a valid tenant name, else InvalidTenant in one line naming `what`.

    Not stripped or folded: what is stored is exactly what was given, so one tenant has one name.
    """
    if not isinstance(name, str):
        raise InvalidTenant(f"{what} must be a string, got {type(name).__name__}")
    if TENANT_NAME.fullmatch(name) is None:
        # repr() escapes control characters, so the line stays one line; long input is cut.
        shown = repr(name) if len(name) <= 70 else repr(name[:70]) + "..."
        raise InvalidTenant(f"{what} {shown} is not a tenant name: {TENANT_RULE}")
    return name
