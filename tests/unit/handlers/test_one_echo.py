"""One echo model: the LangChain chat model and `plain_openai` both answer with `handlers.echo.echo`."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from handlers.chat_models.echo import EchoChatModel
from handlers.echo import EMPTY_ECHO, echo
from handlers.plain_openai.handler import _echo

IMAGE = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
OPENAI_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "user", "content": [{"type": "text", "text": "look  at this"}, IMAGE]},
]
LANGCHAIN_MESSAGES = [
    SystemMessage("Be brief."),
    HumanMessage("first"),
    AIMessage(""),
    HumanMessage(content=[{"type": "text", "text": "look  at this"}, IMAGE]),
]


def _run_plain(messages: list[dict[str, Any]]) -> tuple[list[str], Any]:
    stream = _echo(messages)
    texts: list[str] = []
    try:
        while True:
            texts.append(next(stream).text)
    except StopIteration as done:
        return texts, done.value


def test_both_adapters_echo_the_same_chunks_and_usage() -> None:
    expected = echo((m["role"], m["content"]) for m in OPENAI_MESSAGES)
    assert expected.text == "look  at this" and "".join(expected.chunks) == expected.text
    texts, step = _run_plain(OPENAI_MESSAGES)
    assert (texts, step.text, step.usage) == (list(expected.chunks), expected.text, expected.usage)
    chunks = list(EchoChatModel().stream(LANGCHAIN_MESSAGES))
    assert [c.content for c in chunks if c.content] == list(expected.chunks)
    usage = chunks[-1].usage_metadata
    assert usage is not None
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (
        expected.usage["prompt_tokens"],
        expected.usage["completion_tokens"],
        expected.usage["total_tokens"],
    )


def test_a_message_without_text_is_echoed_as_the_placeholder() -> None:
    assert echo([("user", [IMAGE])]).text == EMPTY_ECHO
    assert echo([("system", "only a prompt")]).text == EMPTY_ECHO
