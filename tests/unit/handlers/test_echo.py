from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage

from chatq.settings import reset_settings
from handlers.chat_models.echo import EMPTY_ECHO, EchoChatModel
from handlers.chat_models.models import VISION_MODELS_ENV, get_chat_model, model_accepts_images
from handlers.chat_models.turn import Deadline, collect, stream_model
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
    assert get_chat_model("echo") is get_chat_model("echo")
    assert isinstance(get_chat_model("echo"), EchoChatModel)


@pytest.fixture
def no_extra_vision_models() -> Iterator[None]:
    saved = os.environ.pop(VISION_MODELS_ENV, None)
    reset_settings()
    yield
    if saved is None:
        os.environ.pop(VISION_MODELS_ENV, None)
    else:
        os.environ[VISION_MODELS_ENV] = saved
    reset_settings()


@pytest.mark.usefixtures("no_extra_vision_models")
def test_model_accepts_images() -> None:
    for name in ("gpt-4o-mini", "gpt-4.1", "gpt-5-nano", "o3-mini", "o4-mini", "llava-vision", "openai/gpt-4o", "echo"):
        assert model_accepts_images(name), name
    for name in ("gpt-3.5-turbo", "llama3", "mistral-7b"):
        assert not model_accepts_images(name), name
    os.environ[VISION_MODELS_ENV] = "llama3, qwen2-vl"
    reset_settings()
    assert model_accepts_images("llama3") and model_accepts_images("qwen2-vl")
