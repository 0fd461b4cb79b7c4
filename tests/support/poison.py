"""A worker plugin for fault tests (CHATQ_PLUGINS=tests.support.poison): ways for a worker to die mid-turn.

- The tool `self_destruct`: the model stub's `[tool: self_destruct {}]` directive makes the model
  call it, so the worker process dies with SIGKILL in the middle of the turn, every time that turn
  runs: a poison turn.
- The directive `[die-before-start: KEY]` in a turn's user message: the first worker that takes the
  turn's message off the queue dies (SIGKILL) before the task body starts, leaving the message in
  its hands (Redis `unacked`). Later workers run the turn normally (once per KEY, per machine).
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
from pathlib import Path
from typing import Any

from celery.signals import task_prerun

from handlers.tools import Tool, register_tool

TOOL_NAME = "self_destruct"
DIE_BEFORE_START = re.compile(r"\[die-before-start:\s*(?P<key>[A-Za-z0-9_-]+)\]")


def self_destruct() -> str:
    """Kill this process at once, as a crash would (no cleanup, no hand-back)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def died_marker(key: str) -> Path:
    """The file that records that a worker already died for KEY."""
    return Path(tempfile.gettempdir()) / f"chatq-test-died-{key}"


def _die_before_start(kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    match = DIE_BEFORE_START.search(str((kwargs or {}).get("content") or ""))
    if match is None:
        return
    marker = died_marker(match["key"])
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _install() -> None:
    task_prerun.connect(_die_before_start, weak=False)
    register_tool(
        Tool(
            name=TOOL_NAME,
            description="Test tool: kills the worker process that runs it (fault tests only).",
            func=self_destruct,
            # Safe to repeat (durable steps): a call cut off by the crash runs again and kills again,
            # so the turn meets the poison rule rather than the journal's "outcome unknown".
            repeatable=True,
        ),
        replace=True,
    )


# Only a worker started with CHATQ_PLUGINS=tests.support.poison gets the deadly tool and hook; a
# test process importing this module for its names must not (its handler tests list the tools).
if __name__ in os.environ.get("CHATQ_PLUGINS", "").split(","):
    _install()
