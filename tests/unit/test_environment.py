"""Every chatq variable is read in `chatq/settings.py`: no other module reads one from the environment.

A variable read elsewhere escapes the one parse and its validation (a bad value then fails a turn
instead of the start), and README's Configuration section stops being the whole list. The check
reads the source: `os.environ[...]`, `os.environ.get(...)` (and `pop`, `setdefault`), `os.getenv(...)`,
also through `from os import environ, getenv`, with a literal name or a module-level constant holding
one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = re.compile(r"^(CHATQ|OPENAI|DATABASE|REDIS)_[A-Z0-9_]*$")
SETTINGS = ROOT / "chatq" / "settings.py"
VARIABLE_PARSERS = (SETTINGS, ROOT / "chatq" / "gateway_variables.py", ROOT / "chatq" / "masking.py")
"""The modules that name the variables they parse or mask (the settings, the gateway's four, the secrets)."""

ALLOWED: dict[str, str] = {
    "chatq/envfile.py": "it fills the environment from .env files before Settings parses it, so it reads "
    "CHATQ_ENV_FILES (which files to read) itself, from the environment it is filling",
}
"""Module (relative path) -> why it may read one of our variables itself."""


def _sources() -> list[Path]:
    paths = [ROOT / "celeryconfig.py"]
    for package in ("chatq", "models", "handlers", "worker"):
        paths.extend(sorted((ROOT / package).rglob("*.py")))
    return [path for path in paths if path != SETTINGS]


def _constants(tree: ast.Module) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _is_environ(node: ast.expr) -> bool:
    """`os.environ` or a bare `environ` (from `from os import environ`)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id == "environ"


def _is_getenv(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "getenv" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id == "getenv"


def _names_read(tree: ast.Module) -> list[tuple[int, str]]:
    constants = _constants(tree)

    def name_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    read: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            lookup = isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault")
            if _is_getenv(func) or (lookup and isinstance(func, ast.Attribute) and _is_environ(func.value)):
                key = node.args[0]
        name = name_of(key) if key is not None else None
        if name is not None and OURS.match(name):
            read.append((node.lineno, name))
    return sorted(read)


def test_only_settings_reads_chatq_variables() -> None:
    offenders = []
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        if relative in ALLOWED:
            continue
        for line, name in _names_read(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{relative}:{line} reads {name}")
    assert offenders == [], "parse these in chatq/settings.py (Settings) instead:\n" + "\n".join(offenders)


def test_the_check_sees_each_way_of_reading() -> None:
    sample = ast.parse(
        "import os\nfrom os import environ, getenv\nNAME = 'CHATQ_X'\n"
        "a = os.environ['REDIS_URL']\nb = os.environ.get('CHATQ_Y')\nc = os.getenv('OPENAI_API_KEY')\n"
        "d = environ.get(NAME)\ne = getenv('DATABASE_URL')\nf = os.environ.pop('CHATQ_Z', None)\n"
        "g = os.environ.get('TERM')\n"
    )
    assert [name for _, name in _names_read(sample)] == [
        "REDIS_URL",
        "CHATQ_Y",
        "OPENAI_API_KEY",
        "CHATQ_X",
        "DATABASE_URL",
        "CHATQ_Z",
    ]


def test_every_variable_settings_reads_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    source = "\n".join(path.read_text(encoding="utf-8") for path in VARIABLE_PARSERS)
    named = set(re.findall(r'"((?:CHATQ|OPENAI|DATABASE|REDIS)_[A-Z0-9_]+)"', source))
    missing = sorted(name for name in named if f"`{name}`" not in readme)
    assert missing == []
