"""`echo`, chatq's offline model (`handlers.echo`), as a LangChain chat model.

A real LangChain chat model that streams `handlers.echo.echo`'s reply, word by word, with its
usage, so the LangChain adapters run without a network or a key exactly as `plain_openai` does.
It never calls tools: `bind_tools` accepts any tools and returns a model that ignores them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from handlers.echo import EMPTY_ECHO, EchoReply, echo

__all__ = ["EMPTY_ECHO", "EchoChatModel"]


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
    def reply_for(messages: Sequence[BaseMessage]) -> EchoReply:
        """What echo answers to `messages` (`handlers.echo.echo`; a HumanMessage is the user's)."""
        return echo(("user" if isinstance(m, HumanMessage) else m.type, m.content) for m in messages)

    @staticmethod
    def usage_for(reply: EchoReply) -> UsageMetadata:
        """The reply's usage, as LangChain reports a provider's."""
        usage = reply.usage
        return UsageMetadata(
            input_tokens=usage["prompt_tokens"],
            output_tokens=usage["completion_tokens"],
            total_tokens=usage["total_tokens"],
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = self.reply_for(messages)
        message = AIMessage(
            content=reply.text,
            usage_metadata=self.usage_for(reply),
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
        for word in reply.chunks:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager:
                run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk
        # Usage comes last, as OpenAI sends it with stream_options.include_usage.
        last = ChatGenerationChunk(
            message=AIMessageChunk(
                content="",
                usage_metadata=self.usage_for(reply),
                response_metadata={"model_name": self.model_name, "finish_reason": "stop"},
                chunk_position="last",
            )
        )
        if run_manager:
            run_manager.on_llm_new_token("", chunk=last)
        yield last
