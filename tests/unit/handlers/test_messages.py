from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from handlers.base import AgentMessage
from handlers.chat_models.messages import (
    content_text,
    image_url,
    langchain_to_payload,
    payload_to_langchain,
    to_agent_message,
    usage_from,
    user_message,
)

PAYLOADS: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief", "tool_calls": None, "tool_call_id": None},
    {"role": "user", "content": "what is 6*7?", "tool_calls": None, "tool_call_id": None},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "name": "calculator", "args": {"expression": "6*7"}}],
        "tool_call_id": None,
    },
    {"role": "tool", "content": "42", "tool_calls": None, "tool_call_id": "call_1"},
    {"role": "assistant", "content": "It is 42.", "tool_calls": None, "tool_call_id": None},
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: str(p["role"]))
def test_payload_round_trip(payload: dict[str, Any]) -> None:
    assert langchain_to_payload(payload_to_langchain(payload)) == payload


def test_payload_types() -> None:
    system, user, call, tool, answer = (payload_to_langchain(p) for p in PAYLOADS)
    assert isinstance(system, SystemMessage) and isinstance(user, HumanMessage)
    assert isinstance(call, AIMessage)
    assert call.tool_calls == [
        {"id": "call_1", "name": "calculator", "args": {"expression": "6*7"}, "type": "tool_call"}
    ]
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == "call_1"
    assert isinstance(answer, AIMessage) and answer.tool_calls == []


def test_langchain_round_trip_preserves_tool_calls() -> None:
    original = AIMessage(content="", tool_calls=[{"id": "c9", "name": "current_time", "args": {"timezone": "UTC"}}])
    back = payload_to_langchain(langchain_to_payload(original))
    assert isinstance(back, AIMessage) and back.tool_calls == original.tool_calls
    tool = ToolMessage(content="2026-01-01T00:00:00+00:00", tool_call_id="c9")
    again = payload_to_langchain(langchain_to_payload(tool))
    assert isinstance(again, ToolMessage) and again.tool_call_id == "c9" and again.content == tool.content


def test_to_agent_message() -> None:
    call = AIMessage(content=[{"type": "text", "text": "checking"}], tool_calls=[{"id": "c", "name": "n", "args": {}}])
    assert to_agent_message(call) == AgentMessage(
        role="assistant", content="checking", tool_calls=[{"id": "c", "name": "n", "args": {}}]
    )
    assert to_agent_message(ToolMessage(content="ok", tool_call_id="c")) == AgentMessage(
        role="tool", content="ok", tool_call_id="c"
    )
    with pytest.raises(ValueError, match="only assistant and tool"):
        to_agent_message(HumanMessage(content="hi"))


def test_content_normalisation() -> None:
    parts: list[str | dict[str, Any]] = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "https://x"}},
        "b",
        {"type": "reasoning", "reasoning": "hidden"},
    ]
    assert content_text(parts) == "ab"
    assert content_text(None) == ""
    assert payload_to_langchain({"role": "assistant", "content": parts}).content == "ab"
    assert payload_to_langchain({"role": "user", "content": None}).content == ""


def test_user_message_with_images() -> None:
    message = user_message("look", ["https://img.test/a.png", "data:image/jpeg;base64,/9j/4AAQ"])
    assert message.content == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://img.test/a.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
    ]
    assert user_message("plain").content == "plain"
    note = user_message("look", ["https://img.test/a.png"], accepts_images=False).content
    assert isinstance(note, str) and note.startswith("look") and "1 image was attached" in note


def test_bare_base64_images_become_data_urls() -> None:
    assert image_url("iVBORw0KGgoAAAANSUhEUg==").startswith("data:image/png;base64,")
    assert image_url("/9j/4AAQSkZJRg==").startswith("data:image/jpeg;base64,")
    assert image_url("R0lGODlhAQABAAAAACw=").startswith("data:image/gif;base64,")


def test_usage_from_sums_usage_metadata() -> None:
    messages = [
        AIMessage(content="", usage_metadata={"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}),
        ToolMessage(content="42", tool_call_id="c"),
        AIMessage(content="x", usage_metadata={"input_tokens": 20, "output_tokens": 5, "total_tokens": 25}),
        AIMessage(content="no usage"),
    ]
    assert usage_from(messages) == {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}
    assert usage_from([]) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
