"""Masking secrets in text: URL passwords and the configured secret values, before a line is logged,
shown or stored. `mask_secrets` is what every log line, error message and event passes through.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["MIN_MASKED_CHARS", "SECRET_VARIABLES", "mask_secrets", "mask_url", "secret_values"]


def mask_url(url: str) -> str:
    """Replace the password of a URL with `***` so the URL can be logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


_SECRET_IN_URL = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")

SECRET_VARIABLES = (
    "OPENAI_API_KEY",
    "CHATQ_API_TOKEN",
    "CHATQ_API_TOKENS",
    "FLOWER_BASIC_AUTH",
    "DATABASE_URL",
    "REDIS_URL",
    "OPENAI_BASE_URL",
    "CHATQ_WEBHOOK_SECRET",
)
"""Variables holding secrets (or URLs with passwords) whose values `mask_secrets` hides wherever they appear."""

MIN_MASKED_CHARS = 4
"""Shorter secret values are not searched for: they would mask ordinary words and protect nothing."""


def secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The secret values configured in `env`: the API key, gateway tokens, Flower and URL passwords."""
    values: list[str] = []
    for name in ("OPENAI_API_KEY", "CHATQ_API_TOKEN", "CHATQ_WEBHOOK_SECRET"):
        values.extend(part.strip() for part in (env.get(name) or "").split(","))
    for name in ("FLOWER_BASIC_AUTH", "CHATQ_API_TOKENS"):  # user:password, tenant:token
        for entry in (env.get(name) or "").split(","):
            values.append(entry.partition(":")[2].strip())
    for name in ("DATABASE_URL", "REDIS_URL", "OPENAI_BASE_URL"):
        try:
            password = urlsplit((env.get(name) or "").strip()).password
        except ValueError:
            continue
        if password:
            values.extend((password, unquote(password)))
    return tuple(sorted({v for v in values if len(v) >= MIN_MASKED_CHARS}, key=len, reverse=True))


@functools.lru_cache(maxsize=8)
def _secret_pattern(raw: tuple[str | None, ...]) -> re.Pattern[str] | None:
    values = secret_values(dict(zip(SECRET_VARIABLES, (v or "" for v in raw), strict=True)))
    return re.compile("|".join(re.escape(value) for value in values)) if values else None


def mask_secrets(text: str) -> str:
    """Mask URL passwords and every configured secret value (`SECRET_VARIABLES`) inside free text.

    For log lines, error messages and events: a model server that echoes the API key in its error
    body must not put the key in a log or in front of a user. The environment is read on each call
    (a few dictionary lookups) and the pattern is built once per set of values.
    """
    text = _SECRET_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    pattern = _secret_pattern(tuple(os.environ.get(name) for name in SECRET_VARIABLES))
    return text if pattern is None else pattern.sub("***", text)
