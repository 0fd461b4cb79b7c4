"""The openai SDK client chatq hands to ChatOpenAI: streamed chunks stay the dicts they arrived as.

For every streamed chunk the SDK builds a `ChatCompletionChunk` (nested pydantic models, through
its unvalidated `construct`, which checks a runtime protocol per model), and langchain-openai's
first step with it is `chunk.model_dump()`, back to a dict. langchain-openai reads dict chunks
directly too, so skipping that round trip changes nothing it sees. Measured against the stub, it
was about two thirds of the CPU a chunk costs between the socket and LangChain.

The override is of a private SDK method. If a later SDK renames it, the override is never called
and chunks are built as before: slower, never wrong. `tests/unit/handlers/test_openai_client.py`
checks that the shortcut is still taken.
"""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

__all__ = ["DictChunkOpenAI", "build_client"]


class DictChunkOpenAI(openai.OpenAI):
    """`openai.OpenAI` whose streamed chat completion chunks are plain dicts (everything else as is)."""

    def _process_response_data(self, *, data: object, cast_to: Any, **kwargs: Any) -> Any:
        if cast_to is ChatCompletionChunk and isinstance(data, dict):
            return data
        return super()._process_response_data(data=data, cast_to=cast_to, **kwargs)


def build_client(*, base_url: str | None, api_key: str, timeout: float, max_retries: int) -> DictChunkOpenAI:
    """A client with ChatOpenAI's settings for these arguments (it keeps the SDK's HTTP pool defaults)."""
    return DictChunkOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
