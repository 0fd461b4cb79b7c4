"""handlers/lc/openai_client.py against the stub: dict chunks, and nothing LangChain sees changes."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletion
from pydantic import SecretStr

from handlers.lc.models import get_chat_model
from handlers.lc.openai_client import DictChunkOpenAI, build_client
from tests.support.openai_stub import OpenAIStub

CONTENTS = ["[words: 4]", "[calc: 6*7]", '[tool: current_time {"timezone": "UTC"}]']


@pytest.fixture
def clients(openai_stub: OpenAIStub) -> Iterator[tuple[openai.OpenAI, DictChunkOpenAI]]:
    openai_stub.clear()
    plain = openai.OpenAI(base_url=openai_stub.base_url, api_key="sk-test", max_retries=0)
    fast = build_client(base_url=openai_stub.base_url, api_key="sk-test", timeout=10, max_retries=0)
    with plain, fast:
        yield plain, fast


def _stable(value: object) -> object:
    """The value without what the stub makes up per response (ids of chunks and tool calls, times)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _stream(client: openai.OpenAI, content: str) -> list[object]:
    return list(
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": content}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )


@pytest.mark.parametrize("content", CONTENTS)
def test_streamed_chunks_are_the_dicts_the_sdk_models_hold(
    clients: tuple[openai.OpenAI, DictChunkOpenAI], content: str
) -> None:
    plain, fast = clients
    built = _stream(plain, content)
    raw = _stream(fast, content)
    assert raw and all(isinstance(chunk, dict) for chunk in raw)
    expected = [_stable(chunk.to_dict()) for chunk in built]  # type: ignore[attr-defined]
    assert [_stable(chunk) for chunk in raw] == expected


def test_a_reply_that_is_not_streamed_is_still_a_model(clients: tuple[openai.OpenAI, DictChunkOpenAI]) -> None:
    _, fast = clients
    reply = fast.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert isinstance(reply, ChatCompletion)
    assert reply.choices[0].message.content == "You said: hi"


@pytest.mark.parametrize("content", CONTENTS)
def test_langchain_builds_the_same_message_from_either_client(
    clients: tuple[openai.OpenAI, DictChunkOpenAI], openai_stub: OpenAIStub, content: str
) -> None:
    replies = []
    for root in clients:
        model = ChatOpenAI(
            model="gpt-4o-mini",
            base_url=openai_stub.base_url,
            api_key=SecretStr("sk-test"),
            stream_usage=True,
            max_retries=0,
            root_client=root,
            client=root.chat.completions,
        )
        chunks = list(model.stream([HumanMessage(content)]))
        merged = chunks[0]
        for chunk in chunks[1:]:
            merged = merged + chunk
        replies.append(merged)
    plain, fast = replies
    assert fast.content == plain.content
    assert _stable(fast.tool_calls) == _stable(plain.tool_calls)
    assert bool(plain.tool_calls) == (content != "[words: 4]")  # the tool cases did call tools
    assert fast.usage_metadata == plain.usage_metadata
    assert fast.response_metadata.get("finish_reason") == plain.response_metadata.get("finish_reason")


def test_the_chat_models_chatq_builds_use_it(stub_env: OpenAIStub) -> None:
    model = get_chat_model("gpt-4o-mini")
    assert isinstance(model, ChatOpenAI)
    assert isinstance(model.root_client, DictChunkOpenAI)
    assert model.client is not None and model.client._client is model.root_client
