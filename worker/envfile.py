"""What the checkout's `.env`-style files mean for `make run`, and `.env.example`'s placeholders.

The files themselves are read by `chatq.envfile` (re-exported here), which `chatq.settings` applies
before it parses anything, so every entry point resolves its configuration the same way: the
process environment, then `.env`, then `.local/services.env` in the current directory.

The placeholders `.env.example` ships (`change-me-...`) are recognised here, so that the commands
that guard something (`chatq serve`, `chatq flower`) can refuse them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from chatq.envfile import (
    ENV_FILES,
    ENV_FILES_VARIABLE,
    env_files,
    load_env_files,
    parse_env_text,
    read_env_files,
    read_with_sources,
)
from chatq.gateway_variables import PLACEHOLDER_PREFIX
from chatq.masking import mask_url


def is_placeholder(value: str) -> bool:
    """True for a secret still holding `.env.example`'s `change-me-...` value."""
    return value.strip().lower().startswith(PLACEHOLDER_PREFIX)


def services_notice(environ: Mapping[str, str], directory: Path | None = None) -> str:
    """What `make run` tells its user: the services this worker uses, and whether chatq started from
    another terminal in this directory (the CLI, the Python API, `celery -A worker`) reaches the same
    ones (it has only the env files to go by)."""
    files = env_files(environ)
    from_files = read_with_sources(directory, files)
    names = ("DATABASE_URL", "REDIS_URL")
    here = {name: environ.get(name, "") for name in names}
    lines = [f"chatq: Postgres {mask_url(here['DATABASE_URL'])}, Redis {mask_url(here['REDIS_URL'])}"]
    differ = [name for name in names if from_files.get(name, ("", None))[0] != here[name]]
    if not differ:
        read = " and ".join(str(path) for path in files)
        lines.append(
            f"chatq: a second terminal in this directory reaches them too (chatq reads {read}):"
            " source .venv/bin/activate; chatq session create"
        )
    for name in differ:
        value, source = from_files.get(name, ("", None))
        seen = f"{mask_url(value)} from {source}" if source else "the default"
        lines.append(f"chatq: note: `chatq` in another terminal here would use {seen} for {name}; export {name} there")
    return "\n".join(lines)


__all__ = [
    "ENV_FILES",
    "ENV_FILES_VARIABLE",
    "PLACEHOLDER_PREFIX",
    "env_files",
    "is_placeholder",
    "load_env_files",
    "parse_env_text",
    "read_env_files",
    "read_with_sources",
    "services_notice",
]
