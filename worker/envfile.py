"""`.env`-style files for the `chatq` command, read the way 12-factor tools read them.

The process environment always wins. Then `.env` in the current directory, then
`.local/services.env` (where `scripts/services.sh` writes the URLs of the Postgres and Redis it
found or started), each only filling variables that are still unset. So a second terminal in the
checkout reaches the same services as `make run` without exporting anything. `CHATQ_ENV_FILES`
(comma-separated paths; empty for none) replaces that list, as the test suite does to stay clear
of a developer's own `.env`.

The format is the common subset of docker compose and python-dotenv: `NAME=value` lines, an
optional `export ` in front, `#` comments (after whitespace on an unquoted value), blank lines,
and single- or double-quoted values (`\\n`, `\\t`, `\\"` and `\\\\` are decoded inside double
quotes). Values are taken literally: no `${VAR}` expansion.

The placeholders `.env.example` ships (`change-me-...`) are recognised here too, so that the
commands that guard something (`chatq serve`, `chatq flower`) can refuse them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from chatq.settings import PLACEHOLDER_PREFIX, mask_url
from worker.errors import ConfigError

ENV_FILES = (Path(".env"), Path(".local") / "services.env")
"""Read in this order, relative to the current directory; an earlier one wins."""

ENV_FILES_VARIABLE = "CHATQ_ENV_FILES"
"""Overrides ENV_FILES: comma-separated paths (relative to the current directory); empty reads none."""

_LINE = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.*?)\s*$")
_DOUBLE_QUOTED = re.compile(r'^"(?P<body>(?:[^"\\]|\\.)*)"\s*(?:#.*)?$')
_SINGLE_QUOTED = re.compile(r"^'(?P<body>[^']*)'\s*(?:#.*)?$")
_QUOTE_RULE = "a {kind}-quoted value must close on its line, followed by nothing but a comment"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def parse_env_text(text: str, *, source: str) -> dict[str, str]:
    """The variables of a `.env`-style text; ConfigError naming the file and line of a bad line."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ConfigError(f"{source} line {number}: expected NAME=value")
        values[match["name"]] = _value(match["value"], source=source, number=number)
    return values


def _value(raw: str, *, source: str, number: int) -> str:
    if raw.startswith('"'):
        quoted = _DOUBLE_QUOTED.match(raw)
        if quoted is None:
            raise ConfigError(f"{source} line {number}: {_QUOTE_RULE.format(kind='double')}")
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], "\\" + m[1]), quoted["body"])
    if raw.startswith("'"):
        quoted = _SINGLE_QUOTED.match(raw)
        if quoted is None:
            raise ConfigError(f"{source} line {number}: {_QUOTE_RULE.format(kind='single')}")
        return quoted["body"]
    # An unquoted value ends where a comment starts: at a `#` after whitespace (as compose reads it).
    return re.split(r"\s+#", raw, maxsplit=1)[0].rstrip()


def read_env_files(directory: Path | None = None, files: tuple[Path, ...] = ENV_FILES) -> dict[str, str]:
    """What the env files in `directory` (default: the current one) say, the earlier file winning."""
    return {name: value for name, (value, _) in _read_with_sources(directory, files).items()}


def _read_with_sources(directory: Path | None, files: tuple[Path, ...]) -> dict[str, tuple[str, Path]]:
    base = Path.cwd() if directory is None else directory
    merged: dict[str, tuple[str, Path]] = {}
    for relative in files:
        path = base / relative
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {relative}: {exc}") from None
        for name, value in parse_env_text(text, source=str(relative)).items():
            merged.setdefault(name, (value, relative))
    return merged


def env_files(environ: Mapping[str, str]) -> tuple[Path, ...]:
    """The files to read: those CHATQ_ENV_FILES lists (none if it is empty), else ENV_FILES."""
    raw = environ.get(ENV_FILES_VARIABLE)
    if raw is None:
        return ENV_FILES
    return tuple(Path(part.strip()) for part in raw.split(",") if part.strip())


def load_env_files(environ: MutableMapping[str, str] | None = None, directory: Path | None = None) -> list[str]:
    """Fill unset variables of `environ` (default: os.environ) from the env files; the names it set."""
    target = os.environ if environ is None else environ
    filled = []
    for name, value in read_env_files(directory, env_files(target)).items():
        if name not in target:
            target[name] = value
            filled.append(name)
    return filled


def is_placeholder(value: str) -> bool:
    """True for a secret still holding `.env.example`'s `change-me-...` value."""
    return value.strip().lower().startswith(PLACEHOLDER_PREFIX)


def services_notice(environ: Mapping[str, str], directory: Path | None = None) -> str:
    """What `make run` tells its user: the services this worker uses, and whether `chatq` in another
    terminal in this directory reaches the same ones (it has only the env files to go by)."""
    files = env_files(environ)
    from_files = _read_with_sources(directory, files)
    names = ("DATABASE_URL", "REDIS_URL")
    here = {name: environ.get(name, "") for name in names}
    lines = [f"chatq: Postgres {mask_url(here['DATABASE_URL'])}, Redis {mask_url(here['REDIS_URL'])}"]
    differ = [name for name in names if from_files.get(name, ("", None))[0] != here[name]]
    if not differ:
        read = " and ".join(str(path) for path in files)
        lines.append(
            f"chatq: a second terminal in this directory reaches them too (`chatq` reads {read}):"
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
    "services_notice",
]
