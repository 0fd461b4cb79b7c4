"""docs/handlers.md shows the handler contract as the code has it, and both ways of writing a handler.

The documented class outlines are compared with the classes (method names, parameters, which are
abstract), and the plain handler example is run as it is written: it must define a complete
handler and register it.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
from pathlib import Path

import pytest

from handlers import framework_names, unregister_framework
from handlers.base import BaseAgentHandler
from handlers.prepared import PreparedTurnHandler

DOC = Path(__file__).resolve().parents[3] / "docs" / "handlers.md"
_BLOCK = re.compile(r"```python\n(?P<code>.*?)```", re.DOTALL)


def _blocks() -> list[str]:
    return [match["code"] for match in _BLOCK.finditer(DOC.read_text(encoding="utf-8"))]


def _outline(header: str) -> dict[str, tuple[list[str], bool]]:
    """The documented methods of the class block starting with `header`: parameters, and whether abstract."""
    [block] = [code for code in _blocks() if code.startswith(header)]
    methods: dict[str, tuple[list[str], bool]] = {}
    abstract = False
    for line in block.splitlines():
        stripped = line.split("#", 1)[0].strip()
        if stripped == "@abstractmethod":
            abstract = True
        elif match := re.match(r"(?:async )?def (\w+)\((.*?)\)", stripped):
            params = [p.split(":")[0].split("=")[0].strip() for p in match[2].split(",") if p.strip()]
            methods[match[1]] = (params, abstract)
            abstract = False
    return methods


def _actual(cls: type, names: list[str]) -> dict[str, tuple[list[str], bool]]:
    abstract = getattr(cls, "__abstractmethods__", frozenset())
    return {name: (list(inspect.signature(getattr(cls, name)).parameters), name in abstract) for name in names}


@pytest.mark.parametrize(
    ("header", "cls"),
    [("class BaseAgentHandler(ABC):", BaseAgentHandler), ("class PreparedTurnHandler(", PreparedTurnHandler)],
)
def test_the_documented_outline_is_the_class(header: str, cls: type) -> None:
    documented = _outline(header)
    assert documented == _actual(cls, list(documented))


def test_the_contract_outline_is_invoke_and_astream_with_an_optional_stream() -> None:
    documented = _outline("class BaseAgentHandler(ABC):")
    assert {name for name, (_, abstract) in documented.items() if abstract} == {"invoke", "astream"}
    assert set(documented) == {"__init__", "invoke", "stream", "astream"}


def test_the_plain_handler_example_defines_a_complete_handler_and_registers_it() -> None:
    [example] = [code for code in _blocks() if "class YourHandler(BaseAgentHandler)" in code]
    ast.parse(example)
    framework = types.ModuleType("your_framework")  # what the example's framework would be
    namespace = {"your_framework": framework, "YourFrameworkError": RuntimeError, "__name__": "docs_example"}
    try:
        exec(compile(example, str(DOC), "exec"), namespace)
        handler = namespace["YourHandler"]
        assert isinstance(handler, type) and issubclass(handler, BaseAgentHandler)
        assert not issubclass(handler, PreparedTurnHandler) and not inspect.isabstract(handler)
        assert "your_framework" in framework_names()
    finally:
        unregister_framework("your_framework")
        sys.modules.pop("docs_example", None)


def test_the_adapter_example_is_a_prepared_turn_handler() -> None:
    [example] = [code for code in _blocks() if "class PlainOpenAIHandler(" in code]
    assert "class PlainOpenAIHandler(PreparedTurnHandler):" in example
    assert "def run(self, turn: TurnInput)" in example
