"""Reading one environment variable's value: a number, a switch, a choice, a list, a URL, a port, an
address or module names, each validated; a bad value is a `ConfigError` naming the variable.

The parsers of `chatq.settings` and `chatq.gateway_variables`; they take the environment as a mapping
(`chatq.envfile.resolved_environ`'s), never reading the process's themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from chatq.errors import ConfigError
from chatq.masking import mask_url

__all__ = [
    "env_address",
    "env_choice",
    "env_float",
    "env_int",
    "env_modules",
    "env_names",
    "env_optional_float",
    "env_port",
    "env_switch",
    "env_url",
]


def env_float(
    env: Mapping[str, str], name: str, default: float, *, minimum: float, maximum: float | None = None
) -> float:
    """A number from the environment (`default` when unset), or ConfigError naming the variable."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum:g}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum:g}, got {raw!r}")
    return value


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    """A whole number from the environment (`default` when unset), or ConfigError naming the variable."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {raw!r}")
    return value


def env_url(env: Mapping[str, str], name: str, default: str, schemes: tuple[str, ...]) -> str:
    """A URL with one of `schemes` (`default` when unset); the error shows it with its password masked."""
    raw = (env.get(name) or "").strip() or default
    scheme = urlsplit(raw).scheme
    if scheme not in schemes:
        raise ConfigError(
            f"{name} must start with one of {', '.join(s + '://' for s in schemes)}, got {mask_url(raw)!r}"
        )
    return raw


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def env_modules(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of Python module names, blanks dropped."""
    names = tuple(part.strip() for part in (env.get(name) or "").split(",") if part.strip())
    for module in names:
        if not _MODULE_NAME.match(module):
            raise ConfigError(f"{name} must list Python module names, got {module!r}")
    return names


def env_optional_float(env: Mapping[str, str], name: str, *, minimum: float) -> float | None:
    """A number from the environment, or None when unset."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return env_float(env, name, 0.0, minimum=minimum)


def env_choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first when unset), case-insensitive."""
    raw = (env.get(name) or "").strip().lower() or choices[0]
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


_ON, _OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


def env_switch(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    """`on`/`off` (also true/false, yes/no, 1/0), case-insensitive; `default` when unset."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in _ON + _OFF:
        raise ConfigError(f"{name} must be on or off, got {raw!r}")
    return raw in _ON


def env_names(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(part.strip() for part in (env.get(name) or "").split(",") if part.strip())


def env_port(env: Mapping[str, str], name: str) -> int | None:
    """A TCP port number, or None when unset."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{name} must be a port number from 1 to 65535, got {raw!r}")
    return int(raw)


def env_address(env: Mapping[str, str], name: str, default: str) -> str:
    """An IP address (brackets stripped) or host name; `default` when unset."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"[A-Za-z0-9.:_-]+", raw.strip("[]")):
        raise ConfigError(f"{name} must be an IP address or host name such as 127.0.0.1 or 0.0.0.0, got {raw!r}")
    return raw.strip("[]")
