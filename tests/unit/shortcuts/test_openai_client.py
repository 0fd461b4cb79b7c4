"""chatq/shortcuts/openai_client.py against the stub: dict chunks, plain-JSON bodies, nothing LangChain
sees changes, and the stock client where the shortcut is not taken."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import openai.resources.chat.completions.completions as sdk_completions
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletion
from pydantic import SecretStr

from chatq.shortcuts import openai_client
from chatq.shortcuts.openai_client import DictChunkOpenAI, PlainJSONCompletions, build_client, is_plain_json
from handlers.chat_models import models
from handlers.chat_models.models import get_chat_model
from handlers.handler_settings import ModelEndpoint
from tests.support.fixtures import STUB_API_KEY
from tests.support.openai_stub import OpenAIStub

CONTENTS = ["[words: 4]", "[calc: 6*7]", '[tool: current_time {"timezone": "UTC"}]']


@pytest.fixture
def clients(openai_stub: OpenAIStub) -> Iterator[tuple[openai.OpenAI, DictChunkOpenAI]]:
    openai_stub.clear()
    plain = openai.OpenAI(base_url=openai_stub.base_url, api_key="sk-test", max_retries=0)
    fast = build_client(base_url=openai_stub.base_url, api_key="sk-test", timeout=10, max_retries=0)
    assert isinstance(fast, DictChunkOpenAI)
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
    model = get_chat_model("gpt-4o-mini", _endpoint(stub_env))
    assert isinstance(model, ChatOpenAI)
    assert isinstance(model.root_client, DictChunkOpenAI)
    assert model.client is not None and model.client._client is model.root_client


@pytest.fixture
def shortcut_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The module's switch off, as when the gate finds another SDK; chat models built afresh."""
    monkeypatch.setattr(openai_client, "ENABLED", False)
    models._openai.cache_clear()
    yield
    models._openai.cache_clear()


@pytest.mark.usefixtures("shortcut_off")
def test_where_the_shortcut_is_off_chatq_builds_on_the_stock_client_and_streams_the_same(
    stub_env: OpenAIStub,
) -> None:
    assert type(build_client(base_url=stub_env.base_url, api_key="k", timeout=5, max_retries=0)) is openai.OpenAI
    model = get_chat_model("gpt-4o-mini", _endpoint(stub_env))
    assert isinstance(model, ChatOpenAI)
    assert type(model.root_client) is openai.OpenAI
    chunks = list(model.stream([HumanMessage("[words: 4]")]))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged.content, str) and len(merged.content.split()) == 4
    assert merged.usage_metadata is not None and merged.usage_metadata["output_tokens"] > 0


# A body like the ones langchain-openai sends, with every shape chatq's handlers produce.
RICH_BODY: dict[str, object] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"x": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        {"role": "user", "content": "[words: 3]"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate arithmetic.",
                "parameters": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            },
        }
    ],
    "tool_choice": "auto",
    "temperature": 0.2,
    "n": 1,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture
def transform_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every body the SDK walks with `maybe_transform` in `chat.completions.create` (observed, not replaced)."""
    seen: list[object] = []
    real = sdk_completions.maybe_transform

    def observed(data: object, expected_type: object) -> object:
        seen.append(data)
        return real(data, expected_type)  # type: ignore[arg-type]

    monkeypatch.setattr(sdk_completions, "maybe_transform", observed)
    return seen


def _sent_body(stub: OpenAIStub, client: openai.OpenAI, body: dict[str, object], **options: object) -> object:
    stub.clear()
    result = client.chat.completions.create(**body, **options)  # type: ignore[call-overload]
    if body.get("stream"):
        list(result)
    (sent,) = stub.requests
    return sent


def test_a_plain_json_body_reaches_the_server_unchanged_without_the_typed_walk(
    clients: tuple[openai.OpenAI, DictChunkOpenAI], openai_stub: OpenAIStub, transform_calls: list[object]
) -> None:
    plain, fast = clients
    assert isinstance(fast.chat.completions, PlainJSONCompletions)
    expected = _sent_body(openai_stub, plain, RICH_BODY)
    walked = len(transform_calls)
    assert walked == 1  # the stock client walks it
    assert _sent_body(openai_stub, fast, RICH_BODY) == expected == RICH_BODY
    assert len(transform_calls) == walked  # ours did not


def test_request_options_are_applied_not_sent_as_body_fields(
    clients: tuple[openai.OpenAI, DictChunkOpenAI], openai_stub: OpenAIStub
) -> None:
    plain, fast = clients
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    options = {"extra_body": {"custom_field": 7}, "extra_headers": {"X-Trace": "t1"}, "timeout": 5.0}
    sent = _sent_body(openai_stub, fast, body, **options)
    assert sent == _sent_body(openai_stub, plain, body, **options)
    assert sent == {**body, "custom_field": 7}


def test_a_raw_response_call_takes_the_shortcut_too(
    clients: tuple[openai.OpenAI, DictChunkOpenAI], openai_stub: OpenAIStub, transform_calls: list[object]
) -> None:
    _, fast = clients
    openai_stub.clear()
    raw = fast.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().choices[0].message.content == "You said: hi"
    assert transform_calls == []


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"stop": ("a", "b")}, id="tuple"),
        pytest.param({"tools": iter(RICH_BODY["tools"])}, id="iterator"),  # type: ignore[call-overload]
        pytest.param({"temperature": openai.NOT_GIVEN}, id="sentinel"),
    ],
)
def test_anything_but_plain_json_takes_the_sdk_path(
    clients: tuple[openai.OpenAI, DictChunkOpenAI],
    openai_stub: OpenAIStub,
    transform_calls: list[object],
    change: dict[str, object],
) -> None:
    _, fast = clients
    body = {**RICH_BODY, "stream": False, **change}
    body.pop("stream_options")
    sent = _sent_body(openai_stub, fast, body)
    assert len(transform_calls) == 1
    assert isinstance(sent, dict) and sent["messages"] == RICH_BODY["messages"]


def test_an_unknown_keyword_fails_as_the_sdk_fails(clients: tuple[openai.OpenAI, DictChunkOpenAI]) -> None:
    plain, fast = clients
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "no_such_option": 1}
    with pytest.raises(TypeError) as stock:
        plain.chat.completions.create(**body)  # type: ignore[call-overload]
    with pytest.raises(TypeError) as ours:
        fast.chat.completions.create(**body)  # type: ignore[call-overload]
    assert str(ours.value) == str(stock.value)


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        ({"a": [1, 2.5, "x", True, None, {"b": []}]}, True),
        ({1: "int key"}, False),
        ([("tuple",)], False),
        ({"a": {1, 2}}, False),
        ({"a": b"bytes"}, False),
    ],
)
def test_is_plain_json(value: object, plain: bool) -> None:
    assert is_plain_json(value) is plain


def _endpoint(stub: OpenAIStub) -> ModelEndpoint:
    """The stub as the endpoint a turn hands the adapter (`TurnInput.endpoint`)."""
    return ModelEndpoint(base_url=stub.base_url, api_key=STUB_API_KEY, timeout=5)
