"""`echo`: chatq's built-in offline chat model.

A real LangChain chat model that streams the last user message's text back, word by word, with
token usage, so every path (graph, streaming, persistence, events) runs without a network or a key.
It never calls tools: `bind_tools` accepts any tools and returns a model that ignores them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from handlers.chat_models.messages import content_text
from handlers.tokens import MESSAGE_OVERHEAD_TOKENS, count_tokens

__all__ = ["EMPTY_ECHO", "EchoChatModel"]

EMPTY_ECHO = "(empty message)"
"""What echo answers to a message without text, so its reply is never empty."""

# A word with the whitespace after it: joining the chunks gives back the text exactly.
_WORD = re.compile(r"\s*\S+\s*|\s+")


class EchoChatModel(BaseChatModel):
    """Echoes the last user message (its text parts; images are ignored), streamed word by word."""

    model_name: str = "echo"
    """Reported in traces and metadata like a real model's name."""

    @property
    def _llm_type(self) -> str:
        return "chatq-echo"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Accept the tools so echo can stand in for any model; it never calls them."""
        return self

    @staticmethod
    def reply_for(messages: Sequence[BaseMessage]) -> str:
        """The text echo answers to `messages`: the last user message's text."""
        for message in reversed(messages):
            if isinstance(message, HumanMessage):
                return content_text(message.content) or EMPTY_ECHO
        return EMPTY_ECHO

    @staticmethod
    def usage_for(messages: Sequence[BaseMessage], reply: str) -> UsageMetadata:
        """Offline token estimate of a call, like a provider's usage report."""
        prompt = sum(count_tokens(content_text(m.content)) + MESSAGE_OVERHEAD_TOKENS for m in messages)
        completion = count_tokens(reply)
        return UsageMetadata(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = self.reply_for(messages)
        message = AIMessage(
            content=reply,
            usage_metadata=self.usage_for(messages, reply),
            response_metadata={"model_name": self.model_name, "finish_reason": "stop"},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        reply = self.reply_for(messages)
        for word in _WORD.findall(reply):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager:
                run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk
        # Usage comes last, as OpenAI sends it with stream_options.include_usage.
        last = ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=self.usage_for(messages, reply),
                response_metadata={"model_name": self.model_name, "finish_reason": "stop"},
                chunk_position="last",
            )
        )
        if run_manager:
            run_manager.on_llm_new_token("", chunk=last)
        yield last
