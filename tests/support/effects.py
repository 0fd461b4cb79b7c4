"""Tools with a visible side effect, for the durable-steps tests: each call appends a line to a file.

`effect` is not safe to repeat (the default); `effect_repeatable` says it is. Each line holds the
call's idempotency key (`handlers.context.ToolContext.idempotency_key`), and the result is
`line N` (the file's line count after the write), so a run whose calls each ran once reads the
same as an uninterrupted run, and a call that ran twice shows in the file.

With `sleep` a call waits that long after its write, the first time its key is written (a slow
service that did the work and has not answered yet): a fault test kills the worker in that window,
and a repeated call answers at once. A worker started with CHATQ_PLUGINS=tests.support.effects
registers both tools (the fault tests); the test process registers them with `effect_tools()`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from handlers.context import current_tool_context
from handlers.tools import Tool, register_tool, unregister_tool

EFFECT = "effect"
EFFECT_REPEATABLE = "effect_repeatable"
PARAMETERS = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "The file to append a line to."},
        "sleep": {"type": "number", "description": "Seconds to wait after the first write of this call."},
    },
    "required": ["path"],
}


def append_line(path: str, sleep: float = 0.0) -> str:
    """Append the call's idempotency key to `path` (then wait `sleep` seconds if the key is new); return `line N`."""
    context = current_tool_context()
    key = context.idempotency_key if context is not None else None
    repeated = f"{key}" in lines(path)
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(f"{key}\n")
    if sleep > 0 and not repeated:
        time.sleep(sleep)
    return f"line {len(lines(path))}"


def lines(path: str | Path) -> list[str]:
    """The lines written so far (none when the file does not exist)."""
    target = Path(path)
    return target.read_text(encoding="utf-8").splitlines() if target.exists() else []


def _tools() -> tuple[Tool, Tool]:
    return (
        Tool(name=EFFECT, description="Append a line to a file.", parameters=PARAMETERS, func=append_line),
        Tool(
            name=EFFECT_REPEATABLE,
            description="Append a line to a file (safe to repeat).",
            parameters=PARAMETERS,
            func=append_line,
            repeatable=True,
        ),
    )


@contextmanager
def effect_tools() -> Iterator[None]:
    """Both tools registered for the block (in this process: the in-process worker runs here)."""
    for tool in _tools():
        register_tool(tool)
    try:
        yield
    finally:
        unregister_tool(EFFECT)
        unregister_tool(EFFECT_REPEATABLE)


# Only a worker started with CHATQ_PLUGINS=tests.support.effects registers them at import; a test
# process importing this module for its names registers them with `effect_tools()`.
if __name__ in os.environ.get("CHATQ_PLUGINS", "").split(","):
    for _tool in _tools():
        register_tool(_tool, replace=True)
