"""chatq's built-in tools' functions: `calculator` (arithmetic by walking the AST, never `eval`) and
`current_time`. The registry (`handlers.tool_registry`) registers them, with `search_knowledge_base`
(`handlers.knowledge_search`), under their names, descriptions and JSON schemas.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = [
    "MAX_EXPONENT",
    "MAX_EXPRESSION_CHARS",
    "MAX_INT_BITS",
    "MAX_TIMEZONE_CHARS",
    "calculate",
    "calculator",
    "current_time",
    "format_number",
]

# --- calculator ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 10_000
MAX_INT_BITS = 4_096  # keeps every intermediate result printable and the work per call tiny

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

Number = int | float


def calculate(expression: str) -> Number:
    """Evaluate arithmetic (numbers, + - * / // % **, unary +-, parentheses) by walking the AST.

    Nothing is ever passed to `eval`: names, calls, attributes, subscripts and every other node are
    rejected, and exponents and integer sizes are bounded so a call cannot eat the worker's CPU.
    """
    if not isinstance(expression, str):
        raise TypeError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise ValueError("expression is nested too deeply") from None
    except OverflowError:
        raise ValueError("result is too large") from None


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed: {node.id!r}")
    if isinstance(node, ast.Attribute):
        raise ValueError("attribute access is not allowed")
    if isinstance(node, ast.Call):
        raise ValueError("function calls are not allowed")
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is too large (limit {MAX_EXPONENT})")
    # Refuse before computing: an integer result would have about bits(base) * exponent bits.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS
    ):
        raise ValueError("result is too large")
    if base < 0 and isinstance(exponent, float) and not exponent.is_integer():
        raise ValueError("fractional power of a negative number")


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise ValueError("complex results are not supported")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError("result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not a finite number")
    if not isinstance(value, int | float):
        raise ValueError("result is not a number")
    return value


def format_number(value: Number) -> str:
    """Render a result: integers exactly, floats with 15 significant digits (6/3 -> "2")."""
    if isinstance(value, int):
        return str(value)
    return format(value, ".15g")


def calculator(expression: str) -> str:
    """The `calculator` tool: `calculate(expression)`, rendered by `format_number`."""
    return format_number(calculate(expression))


# --- current_time ----------------------------------------------------------------------------


MAX_TIMEZONE_CHARS = 64
"""Longer than any IANA time zone name (the longest are about 30 characters)."""

_TIMEZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*")
"""The shape of an IANA name ("America/Argentina/Buenos_Aires", "Etc/GMT+5"): no dots, no empty parts."""


def current_time(timezone: str = "UTC") -> str:
    """The current time in `timezone` (an IANA name such as "Europe/Paris"), ISO 8601.

    The name is checked before it reaches `zoneinfo`, which turns it into a file path: an odd name
    gets "unknown time zone", never an operating-system error that would show the model a path.
    """
    if not isinstance(timezone, str) or not timezone.strip():
        raise ValueError("timezone must be an IANA time zone name such as 'UTC' or 'Europe/Paris'")
    name = timezone.strip()
    if name.upper() in ("UTC", "Z", "GMT"):
        return datetime.now(UTC).isoformat(timespec="seconds")
    if len(name) > MAX_TIMEZONE_CHARS:
        raise ValueError(f"unknown time zone: names are at most {MAX_TIMEZONE_CHARS} characters, like 'Europe/Paris'")
    if not _TIMEZONE_NAME.fullmatch(name):
        raise ValueError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris'")
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}") from None
    return datetime.now(zone).isoformat(timespec="seconds")
