"""Registry tools (`handlers.tool_registry`) wrapped as LangChain tools for binding and execution."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from handlers.tool_registry import Tool, get_tool
from handlers.tools import run_tool

__all__ = ["langchain_tool", "langchain_tools"]


def langchain_tool(tool: Tool) -> BaseTool:
    """`tool` as a StructuredTool whose JSON schema is the registry's own (no pydantic model needed)."""

    def call(**kwargs: Any) -> str:
        # run_tool returns errors as "Error: ..." text, as the tool contract asks.
        return run_tool(tool.name, kwargs)

    return StructuredTool(
        name=tool.name,
        description=tool.description,
        args_schema=dict(tool.parameters),
        func=call,
    )


@functools.lru_cache(maxsize=64)
def _cached(names: tuple[str, ...]) -> tuple[BaseTool, ...]:
    return tuple(langchain_tool(get_tool(name)) for name in names)


def langchain_tools(names: Sequence[str]) -> list[BaseTool]:
    """The LangChain tools for `names`, in order; raises UnknownTool for a name not registered."""
    return list(_cached(tuple(names)))
