"""Tools with a visible side effect, for the durable-steps tests: each call appends a line to a file.

`effect` is not safe to repeat (the default); `effect_repeatable` says it is. Each line holds the
call's idempotency key (`handlers.context.ToolContext.idempotency_key`), and the result is
`line N` (the file's line count after the write), so a run whose calls each ran once reads the
same as an uninterrupted run, and a call that ran twice shows in the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from handlers.context import current_tool_context
from handlers.tools import Tool, register_tool, unregister_tool

EFFECT = "effect"
EFFECT_REPEATABLE = "effect_repeatable"
PARAMETERS = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "The file to append a line to."}},
    "required": ["path"],
}


def append_line(path: str) -> str:
    """Append the call's idempotency key to `path`; return `line N`."""
    context = current_tool_context()
    key = context.idempotency_key if context is not None else None
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(f"{key}\n")
    return f"line {len(lines(path))}"


def lines(path: str | Path) -> list[str]:
    """The lines written so far (none when the file does not exist)."""
    target = Path(path)
    return target.read_text(encoding="utf-8").splitlines() if target.exists() else []


@contextmanager
def effect_tools() -> Iterator[None]:
    """Both tools registered for the block (in this process: the in-process worker runs here)."""
    register_tool(Tool(name=EFFECT, description="Append a line to a file.", parameters=PARAMETERS, func=append_line))
    register_tool(
        Tool(
            name=EFFECT_REPEATABLE,
            description="Append a line to a file (safe to repeat).",
            parameters=PARAMETERS,
            func=append_line,
            repeatable=True,
        )
    )
    try:
        yield
    finally:
        unregister_tool(EFFECT)
        unregister_tool(EFFECT_REPEATABLE)
