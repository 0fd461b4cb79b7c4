from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from handlers.builtin_tools import MAX_EXPRESSION_CHARS, calculate, current_time
from handlers.context import ToolContext
from handlers.errors import UnknownTool
from handlers.handler_settings import ToolSettings
from handlers.tool_registry import Tool, default_tool_names, get_tool, list_tools, register_tool, unregister_tool
from handlers.tools import TRUNCATION_MARK, run_tool


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("6*7", "42"),
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("-(3)", "-3"),
        ("+4", "4"),
        ("1.5e3 + 0.5", "1500.5"),
        ("2 ** -1", "0.5"),
        ("1 / 3", "0.333333333333333"),
    ],
)
def test_calculator_arithmetic(expression: str, expected: str) -> None:
    assert run_tool("calculator", {"expression": expression}) == expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("__import__('os').system('true')", "not allowed"),
        ("os", "names are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("().__class__", "not allowed"),
        ("abs(-1)", "not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1, 2]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("1 < 2", "unsupported syntax"),
        ("1 << 100", "unsupported syntax"),
        ("x = 1", "not an arithmetic expression"),
        ("9 ** 9 ** 9", "too large"),
        ("2 ** 100000", "too large"),
        ("10 ** 5000", "too large"),
        ("(2 ** 4000) * (2 ** 4000)", "too large"),
        ("10.0 ** 400", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "by zero"),
        ("(-8) ** 0.5", "fractional power of a negative number"),
    ],
)
def test_calculator_refuses_unsafe_or_invalid_input(expression: str, fragment: str) -> None:
    result = run_tool("calculator", {"expression": expression})
    assert result.startswith("Error: ")
    assert fragment in result


def test_calculator_bounds_expression_length_and_nesting() -> None:
    assert "longer than" in run_tool("calculator", {"expression": "1+" * MAX_EXPRESSION_CHARS + "1"})
    assert run_tool("calculator", {"expression": "(" * 210 + "1" + ")" * 210}).startswith("Error:")
    assert run_tool("calculator", {"expression": "-" * 400 + "1"}) == "1"
    with pytest.raises(ValueError, match="function calls are not allowed"):
        calculate("__import__('os')")
    with pytest.raises(ValueError, match="names are not allowed"):
        calculate("__builtins__")


def test_calculator_argument_errors_are_results() -> None:
    assert run_tool("calculator", {}).startswith("Error: ")
    assert run_tool("calculator", {"expression": "1", "extra": 2}).startswith("Error: ")
    assert run_tool("calculator", {"expression": 5}).startswith("Error: ")


def test_current_time_is_iso_8601() -> None:
    now = datetime.fromisoformat(current_time())
    assert now.utcoffset() == timedelta(0)
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)
    paris = datetime.fromisoformat(run_tool("current_time", {"timezone": "Europe/Paris"}))
    assert paris.utcoffset() in (timedelta(hours=1), timedelta(hours=2))
    assert datetime.fromisoformat(run_tool("current_time", None)).utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus_Mons", "../../etc/passwd", "", "A" * 300, "Europe/" + "x" * 300, "Europe", "a\x00b"]
)
def test_current_time_rejects_unknown_zones_without_showing_a_server_path(zone: str) -> None:
    result = run_tool("current_time", {"timezone": zone})
    assert result.startswith("Error: "), result
    # zoneinfo turns the name into a file path; neither the path nor an OS error reaches the model.
    assert "/usr/" not in result and "site-packages" not in result and "Errno" not in result, result
    assert len(result) < 200


def test_registry() -> None:
    assert [t.name for t in list_tools()][:2] == ["calculator", "current_time"]
    assert get_tool("calculator").name == "calculator"
    with pytest.raises(UnknownTool, match="calculator"):
        get_tool("nope")
    assert run_tool("nope", {}).startswith("Error: Unknown tool 'nope'")
    with pytest.raises(ValueError, match="already registered"):
        register_tool(Tool(name="calculator", description="x", func=lambda: "x"))
    with pytest.raises(ValueError, match="invalid tool name"):
        register_tool(Tool(name="bad name", description="x", func=lambda: "x"))


@pytest.fixture
def scratch_tools() -> Iterator[list[str]]:
    """Names registered by a test, removed afterwards so other tests see only the built-ins."""
    names: list[str] = []
    yield names
    for name in names:
        unregister_tool(name)


def test_paid_tools_are_not_defaults(scratch_tools: list[str]) -> None:
    scratch_tools += ["paid_search_test", "free_test_tool"]
    register_tool(Tool(name="paid_search_test", description="costs money", func=lambda: "result", paid=True))
    register_tool(Tool(name="free_test_tool", description="free", func=lambda: "ok"))
    assert "paid_search_test" not in default_tool_names()
    assert "free_test_tool" in default_tool_names()
    assert {"calculator", "current_time"} <= set(default_tool_names())
    assert run_tool("paid_search_test", {}) == "result"
    unregister_tool("free_test_tool")
    assert "free_test_tool" not in default_tool_names()


@pytest.fixture
def small_tool_output() -> Iterator[int]:
    from chatq.settings import reset_settings

    saved = os.environ.get("CHATQ_MAX_TOOL_OUTPUT_CHARS")
    os.environ["CHATQ_MAX_TOOL_OUTPUT_CHARS"] = "100"
    reset_settings()
    yield 100
    if saved is None:
        os.environ.pop("CHATQ_MAX_TOOL_OUTPUT_CHARS", None)
    else:
        os.environ["CHATQ_MAX_TOOL_OUTPUT_CHARS"] = saved
    reset_settings()


def test_tool_output_is_cut(small_tool_output: int, scratch_tools: list[str]) -> None:
    scratch_tools.append("chatty_test_tool")
    register_tool(Tool(name="chatty_test_tool", description="long", func=lambda: "x" * 1000))
    # Outside a turn nothing is handed in: the process's CHATQ_MAX_TOOL_OUTPUT_CHARS.
    result = run_tool("chatty_test_tool", {})
    assert len(result) == small_tool_output
    assert result.endswith(TRUNCATION_MARK)
    # In a turn the limit comes with the tool context (the worker's settings), not from the process.
    handed_in = ToolContext(session_id=None, settings=ToolSettings(max_output_chars=40))
    cut = run_tool("chatty_test_tool", {}, context=handed_in)
    assert len(cut) == 40 and cut.endswith(TRUNCATION_MARK)
    uncut = run_tool("chatty_test_tool", {}, context=ToolContext(session_id=None, settings=ToolSettings()))
    assert uncut == "x" * 1000
