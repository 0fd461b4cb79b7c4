"""A worker plugin for fault tests (CHATQ_PLUGINS=tests.support.poison): a tool that kills its worker.

The model stub's `[tool: self_destruct {}]` directive makes the model call it, so the worker
process dies with SIGKILL in the middle of a turn, every time that turn runs: a poison turn.
"""

from __future__ import annotations

import os
import signal

from handlers.tools import Tool, register_tool

TOOL_NAME = "self_destruct"


def self_destruct() -> str:
    """Kill this process at once, as a crash would (no cleanup, no hand-back)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


register_tool(
    Tool(
        name=TOOL_NAME,
        description="Test tool: kills the worker process that runs it (fault tests only).",
        func=self_destruct,
    ),
    replace=True,
)
