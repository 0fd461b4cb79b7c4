"""The stub itself, driven by the real openai SDK (what langchain-openai uses underneath)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import openai
import pytest

from tests.support.openai_stub import OpenAIStub


@pytest.fixture
def client(openai_stub: OpenAIStub) -> Iterator[openai.OpenAI]:
    openai_stub.clear()
    with openai.OpenAI(base_url=openai_stub.base_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def test_non_streaming_reply_and_usage(client: openai.OpenAI, openai_stub: OpenAIStub) -> None:
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi there"}])
    assert reply.choices[0].message.content == "You said: hi there"
    assert reply.usage is not None and reply.usage.total_tokens > 0
    assert openai_stub.requests[0]["messages"] == [{"role": "user", "content": "hi there"}]


def test_streaming_words_then_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "[words: 3]"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert text == ["w1 ", "w2 ", "w3"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_streamed_tool_call(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "[calc: 6*7]"}], stream=True
    )
    arguments, name, finish = "", None, None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or ():
                if call.function and call.function.name:
                    name = call.function.name
                arguments += (call.function.arguments or "") if call.function else ""
    assert name == "calculator" and json.loads(arguments) == {"expression": "6*7"} and finish == "tool_calls"


def test_failure_directives(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[fail]"}])
    key = uuid.uuid4().hex
    message = [{"role": "user", "content": f"[fail-times: {key} 2]"}]
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=message)  # type: ignore[arg-type]
    assert client.chat.completions.create(model="m", messages=message).choices[0].message.content == "You said: "  # type: ignore[arg-type]


def test_sleep_delays_the_first_byte(client: openai.OpenAI) -> None:
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.3).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "[sleep: 2]"}]
        )
    assert time.monotonic() - started < 1.5


def test_recorded_requests_over_http(openai_stub: OpenAIStub, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "remember me"}])
    with urllib.request.urlopen(openai_stub.base_url.removesuffix("/v1") + "/_requests", timeout=5) as response:
        bodies = json.load(response)
    assert bodies[-1]["messages"][-1]["content"] == "remember me"


def test_runs_as_a_module() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.openai_stub", "--port", "0", "--latency", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
            reply = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "ping"}])
        assert reply.choices[0].message.content == "You said: ping"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_a_reply_to_a_request_from_before_clear_is_not_recorded(openai_stub: OpenAIStub, client: openai.OpenAI) -> None:
    """A timed-out test's request answered late must not show up in the next test's replies."""
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.2).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "[sleep: 0.6]"}]
        )
    openai_stub.clear()  # the next test starts
    time.sleep(0.9)  # the stub answers the old request meanwhile
    assert openai_stub.replies == []
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "now"}])
    assert [reply["content"] for reply in openai_stub.replies] == ["You said: now"]


def test_a_windowed_provider_refuses_past_its_window_until_it_frees() -> None:
    from handlers.provider_headers import read_rate_limit_headers
    from tests.support.provider_limits import ProviderLimits

    limits = ProviderLimits(rpm=120, window=0.5)  # 1 request per 0.5 s window, 120 a minute
    assert limits.enter(10) is None
    limits.leave()
    refusal = limits.enter(10)
    assert refusal is not None and refusal.status == 429
    assert refusal.headers["x-ratelimit-limit-requests"] == "120"
    assert refusal.headers["x-ratelimit-remaining-requests"] == "0"
    assert refusal.headers["retry-after"] == "1"  # whole seconds, rounded up
    read = read_rate_limit_headers(refusal.headers)
    assert read.retry_after is not None and 0.3 < read.retry_after <= 0.5  # the reset, to the millisecond
    time.sleep(read.retry_after)
    assert limits.enter(10) is None, "the window freed when the reset said"
    assert limits.stats()["refused"] == 1
