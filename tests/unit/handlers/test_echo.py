from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage

from chatq.errors import ConfigError
from chatq.settings import Settings
from handlers.chat_models.echo import EMPTY_ECHO, EchoChatModel
from handlers.chat_models.models import get_chat_model, model_accepts_images
from handlers.chat_models.turn import Deadline, collect, stream_model
from handlers.handler_settings import HandlerSettings, ModelEndpoint
from handlers.tools import default_tool_names


def test_echo_streams_word_chunks_with_usage() -> None:
    model = EchoChatModel()
    chunks = list(model.stream([SystemMessage("sys"), HumanMessage("one two  three")]))
    texts = [c.content for c in chunks if c.content]
    assert texts == ["one ", "two  ", "three"]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert isinstance(merged, AIMessageChunk)
    assert merged.content == "one two  three"
    usage = merged.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_echo_invoke_echoes_the_last_user_message() -> None:
    reply = EchoChatModel().invoke([HumanMessage("first"), AIMessage("x"), HumanMessage("second")])
    assert isinstance(reply, AIMessage)
    assert reply.content == "second"
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] > 0


def test_echo_ignores_images_and_never_calls_tools() -> None:
    from handlers.langgraph.tools import langchain_tools

    bound = EchoChatModel().bind_tools(langchain_tools(default_tool_names()))
    message = HumanMessage(
        content=[{"type": "text", "text": "6*7?"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    )
    reply = collect(stream_model(bound, [message], Deadline(5)))
    assert reply.content == "6*7?"
    assert reply.tool_calls == []
    assert EchoChatModel().invoke([HumanMessage("")]).content == EMPTY_ECHO


def test_get_chat_model_caches_per_process() -> None:
    endpoint = ModelEndpoint()
    assert get_chat_model("echo", endpoint) is get_chat_model("echo", endpoint)
    assert isinstance(get_chat_model("echo", endpoint), EchoChatModel)


def test_get_chat_model_refuses_a_model_the_endpoint_cannot_serve() -> None:
    with pytest.raises(ConfigError, match="needs OPENAI_API_KEY or OPENAI_BASE_URL"):
        get_chat_model("gpt-4o-mini", ModelEndpoint())


def test_model_accepts_images() -> None:
    for name in ("gpt-4o-mini", "gpt-4.1", "gpt-5-nano", "o3-mini", "o4-mini", "llava-vision", "openai/gpt-4o", "echo"):
        assert model_accepts_images(name), name
    for name in ("gpt-3.5-turbo", "llama3", "mistral-7b"):
        assert not model_accepts_images(name), name
    # CHATQ_VISION_MODELS, handed in (`HandlerSettings.vision_models`).
    vision = HandlerSettings.of(Settings(vision_models=("llama3", "qwen2-vl"))).vision_models
    assert model_accepts_images("llama3", vision) and model_accepts_images("qwen2-vl", vision)
    assert not model_accepts_images("mistral-7b", vision)
