"""`.env`-style files: the one place every chatq process fills its environment from.

Every entry point resolves its configuration the same way, in this order: the process
environment, then `.env` in the current directory, then `.local/services.env` (where
`scripts/services.sh` records the Postgres and Redis a clone settled on), each file only filling
variables that are still unset. `chatq.settings` applies the files before it parses anything
(`resolved_environ`), so the `chatq` command, the Python API, `celery -A worker ...`, the gateway
and Flower all see the same values, and a second terminal in the checkout reaches the services
`make run` uses without exporting anything. `CHATQ_ENV_FILES` (comma-separated paths; empty for
none) replaces that list, as the test suite does to stay clear of a developer's own files.

The format is the common subset of docker compose and python-dotenv: `NAME=value` lines, an
optional `export ` in front, `#` comments (after whitespace on an unquoted value), blank lines,
and single- or double-quoted values (`\\n`, `\\t`, `\\"` and `\\\\` are decoded inside double
quotes). Values are taken literally: no `${VAR}` expansion.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from chatq.errors import ConfigError

__all__ = [
    "ENV_FILES",
    "ENV_FILES_VARIABLE",
    "env_files",
    "load_env_files",
    "parse_env_text",
    "read_env_files",
    "read_with_sources",
    "resolved_environ",
]

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
    return {name: value for name, (value, _) in read_with_sources(directory, files).items()}


def read_with_sources(directory: Path | None, files: tuple[Path, ...]) -> dict[str, tuple[str, Path]]:
    """Each variable the files set, with the file it came from (the earlier file winning)."""
    base = Path.cwd() if directory is None else directory
    merged: dict[str, tuple[str, Path]] = {}
    for relative in files:
        path = base / relative
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
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


def resolved_environ() -> Mapping[str, str]:
    """The process environment after the env files filled what it leaves unset (what settings parse).

    Filling `os.environ` itself, not a copy, so that what this process starts (Celery's children,
    `chatq worker`'s processes, Flower) and the libraries that read the environment see the same.
    Cheap to repeat: with every variable already set, or `CHATQ_ENV_FILES=""`, it changes nothing.
    """
    load_env_files(os.environ)
    return os.environ
