"""LangGraphHandler against the OpenAI stub: real langchain-openai over HTTP, real LangGraph, real Postgres."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from handlers import AgentInvocationError, AgentMessage, StreamEvent, get_agent_handler
from handlers.base import SessionInfo, Usage
from handlers.errors import ThreadHopError, UnknownTool
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.handlers import stream_turn
from tests.support.openai_stub import OpenAIStub

MakeSession = Callable[..., SessionInfo]


def _summed_usage(stub: OpenAIStub) -> Usage:
    totals = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for reply in stub.replies:
        for key in totals:
            totals[key] += (reply["usage"] or {}).get(key, 0)
    return totals


def test_plain_reply_via_invoke(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())
    messages, usage = handler.invoke("hello there")
    assert messages == [AgentMessage(role="assistant", content="You said: hello there")]
    assert usage == _summed_usage(stub_env)
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_stream_sends_text_before_one_final(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    events = list(stream_turn(get_agent_handler(make_session()), "stream me [words: 5]"))
    kinds = [e.kind for e in events]
    assert kinds.count("final") == 1 and kinds[-1] == "final"
    texts = [e.text for e in events if e.kind == "text"]
    assert len(texts) >= 5  # word by word, not one blob at the end
    assert "".join(texts) == "w1 w2 w3 w4 w5"
    final = events[-1]
    assert final.response == [AgentMessage(role="assistant", content="w1 w2 w3 w4 w5")]
    assert final.usage == _summed_usage(stub_env)


def test_text_arrives_while_the_model_is_still_streaming(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    started = time.monotonic()
    seen: list[tuple[float, StreamEvent]] = []
    for event in stream_turn(get_agent_handler(make_session()), "[words: 6] [slow: 0.15]"):
        seen.append((time.monotonic() - started, event))
    first_text = next(t for t, e in seen if e.kind == "text")
    final_at = seen[-1][0]
    assert final_at - first_text > 0.5  # tokens were relayed as they came, not after the reply


def test_system_prompt_is_the_first_message(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(system_prompt="You are Marvin, a paranoid android."))
    handler.invoke("who are you?")
    sent = stub_env.requests[0]["messages"]
    assert sent[0]["role"] == "system"
    assert sent[0]["content"].startswith("You are Marvin, a paranoid android.")
    assert "calculator" in sent[0]["content"]  # the shared policy names the bound tools
    assert sent[-1] == {"role": "user", "content": "who are you?"}
    assert sum(1 for m in sent if m["role"] == "system") == 1
    tool_names = {t["function"]["name"] for t in stub_env.requests[0]["tools"]}
    assert tool_names == {"calculator", "current_time"}


def test_calculator_round_trip(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    events = list(stream_turn(get_agent_handler(make_session()), "what is six times seven? [calc: 6*7]"))
    final = events[-1]
    assert final.kind == "final"
    call, result, answer = final.response
    assert call.role == "assistant" and call.tool_calls is not None
    (tool_call,) = call.tool_calls
    assert tool_call["name"] == "calculator" and tool_call["args"] == {"expression": "6*7"}
    assert result == AgentMessage(role="tool", content="42", tool_call_id=tool_call["id"])
    assert answer == AgentMessage(role="assistant", content="The answer is 42.")

    tool_events = [e.tool for e in events if e.kind == "tool"]
    assert tool_events == [
        {"id": tool_call["id"], "name": "calculator", "status": "started"},
        {"id": tool_call["id"], "name": "calculator", "status": "finished"},
    ]
    started = next(i for i, e in enumerate(events) if e.kind == "tool")
    assert "".join(e.text for e in events[started:] if e.kind == "text") == "The answer is 42."

    # The second request carries the assistant's tool call and the tool's result.
    assert len(stub_env.requests) == 2
    second = stub_env.requests[1]["messages"]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["id"] == tool_call["id"]
    assert second[-1] == {"role": "tool", "content": "42", "tool_call_id": tool_call["id"]}
    assert final.usage == _summed_usage(stub_env)


def test_tool_exception_comes_back_as_error_text(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    messages, _ = get_agent_handler(make_session()).invoke("divide [calc: 1/0]")
    assert [m.role for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[1].content.startswith("Error:") and "zero" in messages[1].content
    assert messages[2].content.startswith("The answer is Error:")


def test_unknown_tool_is_an_error_result_not_a_crash(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    messages, _ = get_agent_handler(make_session()).invoke('x [tool: launch_rockets {"count": 3}]')
    assert messages[1].role == "tool"
    assert messages[1].content.startswith("Error: unknown tool 'launch_rockets'")


def test_generic_tool_directive_runs_current_time(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    messages, _ = get_agent_handler(make_session()).invoke('time? [tool: current_time {"timezone": "UTC"}]')
    assert messages[1].role == "tool" and messages[1].content.endswith("+00:00")


def test_recursion_limit_fails_the_invocation(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    with pytest.raises(AgentInvocationError, match="too many tool steps"):
        get_agent_handler(make_session()).invoke("[loop: 1+1]")
    assert 3 <= len(stub_env.requests) <= 6  # bounded by recursion_limit=10 graph steps


def test_timeout_fails_in_about_the_timeout(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())
    with environ(CHATQ_TURN_TIMEOUT="1"):
        started = time.monotonic()
        with pytest.raises(AgentInvocationError, match="turn timeout"):
            handler.invoke("hello [sleep: 5]")
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 2.5


def test_a_trickling_stream_is_cut_at_the_timeout(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())
    texts: list[str] = []
    with environ(CHATQ_TURN_TIMEOUT="1"):
        started = time.monotonic()
        with pytest.raises(AgentInvocationError, match="turn timeout"):
            for event in stream_turn(handler, "[words: 50] [slow: 0.1]"):
                texts.append(event.text)
        elapsed = time.monotonic() - started
    assert texts  # some text arrived before the cut
    assert elapsed < 2.0


def test_server_error_is_an_invocation_error(
    stub_env: OpenAIStub, make_session: MakeSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AgentInvocationError) as info:
        get_agent_handler(make_session()).invoke("boom [fail]")
    assert info.value.message == "The model service returned an error (HTTP 500)."
    assert len(stub_env.requests) == 1  # no hidden SDK retries: chatq retries itself
    assert STUB_API_KEY not in caplog.text


def test_fail_once_then_succeed(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())
    key = uuid.uuid4().hex
    with pytest.raises(AgentInvocationError):
        handler.invoke(f"hi [fail-once: {key}]")
    messages, _ = handler.invoke(f"hi [fail-once: {key}]")
    assert messages[-1].content == "You said: hi"


def test_empty_completion_is_an_invocation_error(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    with pytest.raises(AgentInvocationError, match="empty reply"):
        get_agent_handler(make_session()).invoke("nothing [empty]")


def test_unreachable_server_is_an_invocation_error(make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())
    with (
        environ(OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_KEY="sk-x"),
        pytest.raises(AgentInvocationError, match="Could not reach"),
    ):
        handler.invoke("hello")


def test_images_reach_a_vision_model_as_image_url_parts(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    image = "data:image/png;base64,iVBORw0KGgo="
    get_agent_handler(make_session(model="gpt-4o-mini")).invoke("what is this?", images=[image])
    user = stub_env.requests[0]["messages"][-1]
    assert user["role"] == "user"
    assert user["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": image}},
    ]


def test_a_text_only_model_gets_a_note_instead_of_images(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    get_agent_handler(make_session(model="gpt-3.5-turbo")).invoke("look", images=["https://x.test/a.png"] * 2)
    user = stub_env.requests[0]["messages"][-1]
    assert isinstance(user["content"], str)
    assert user["content"].startswith("look") and "2 images were attached" in user["content"]


def test_session_metadata_chooses_tools(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session(metadata={"tools": ["calculator"]}))
    handler.invoke("hi")
    assert [t["function"]["name"] for t in stub_env.requests[0]["tools"]] == ["calculator"]
    with pytest.raises(UnknownTool):
        get_agent_handler(make_session(metadata={"tools": ["nope"]})).invoke("hi")


def test_history_is_sent_before_the_new_message(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    from models.db import session_scope
    from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, Turn, TurnStatus

    session = make_session()
    turn_id = uuid.uuid4()
    with session_scope() as db:
        db.add(Turn(id=turn_id, session_id=session.id, position=0, status=TurnStatus.SUCCEEDED))
        db.flush()
        rows = [
            ("user", "what is 6*7?", None, None),
            ("assistant", "", [{"id": "call_h1", "name": "calculator", "args": {"expression": "6*7"}}], None),
            ("tool", "42", None, "call_h1"),
            ("assistant", "It is 42.", None, None),
        ]
        for i, (role, content, calls, call_id) in enumerate(rows):
            db.add(
                ChatMessage(
                    session_id=session.id,
                    turn_id=turn_id,
                    position=i,
                    role=role,
                    content=content,
                    tool_calls=calls,
                    tool_call_id=call_id,
                )
            )
    assert len(rows) < MESSAGE_POSITION_STRIDE
    get_agent_handler(session).invoke("and doubled?")
    sent = stub_env.requests[0]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[2]["tool_calls"][0]["id"] == "call_h1"
    assert sent[2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert sent[3]["tool_call_id"] == "call_h1"
    assert sent[-1]["content"] == "and doubled?"


def test_astream_yields_chunks_then_usage(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())

    async def collect() -> list[tuple[str, Usage]]:
        return [item async for item in handler.astream("async please")]

    items = asyncio.run(collect())
    assert all(usage == {} for _, usage in items[:-1])
    assert "".join(text for text, _ in items) == "You said: async please"
    assert items[-1][1] == _summed_usage(stub_env)


def test_astream_raises_invocation_errors(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    handler = get_agent_handler(make_session())

    async def drain() -> None:
        async for _ in handler.astream("[fail]"):
            pass

    with pytest.raises(AgentInvocationError):
        asyncio.run(drain())


def test_echo_model_needs_no_key_and_no_network(make_session: MakeSession) -> None:
    with environ(OPENAI_BASE_URL="", OPENAI_API_KEY=""):
        handler = get_agent_handler(make_session(model="echo"))
        events = list(stream_turn(handler, "echo this back"))
    assert "".join(e.text for e in events if e.kind == "text") == "echo this back"
    final = events[-1]
    assert final.response == [AgentMessage(role="assistant", content="echo this back")]
    assert final.usage is not None and final.usage["prompt_tokens"] > 0 and final.usage["completion_tokens"] > 0


def test_concurrent_turns_share_the_graph_and_client(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    from concurrent.futures import ThreadPoolExecutor

    sessions = [make_session() for _ in range(8)]

    def run(i: int) -> list[AgentMessage]:
        messages, _ = get_agent_handler(sessions[i]).invoke(f"turn {i} [calc: {i}*{i}] [slow: 0.01]")
        return messages

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, range(8)))
    for i, messages in enumerate(results):
        assert [m.role for m in messages] == ["assistant", "tool", "assistant"]
        assert messages[1].content == str(i * i)
        assert messages[2].content == f"The answer is {i * i}."
    assert len(stub_env.requests) == 16


def test_closing_the_stream_early_stops_the_model_call(stub_env: OpenAIStub, make_session: MakeSession) -> None:
    stream = stream_turn(get_agent_handler(make_session()), "[words: 60] [slow: 0.1]")
    first = next(stream)
    assert first.kind == "text"
    started = time.monotonic()
    stream.close()  # a cancelled turn: the worker stops reading
    assert time.monotonic() - started < 1.0  # not the ~6 s the rest of the reply would take


def test_a_stream_advanced_on_another_thread_is_refused_in_one_line(
    stub_env: OpenAIStub, make_session: MakeSession
) -> None:
    stream = stream_turn(get_agent_handler(make_session()), "[words: 6] [slow: 0.01]")
    assert next(stream).kind == "text"
    raised: list[BaseException] = []
    other = threading.Thread(target=lambda: raised.extend(_exception_of(lambda: next(stream))))
    other.start()
    other.join()
    assert len(raised) == 1 and isinstance(raised[0], ThreadHopError)
    assert not isinstance(raised[0], AgentInvocationError)  # a caller's mistake: not retried as the agent's
    assert "\n" not in str(raised[0]) and "astream()" in str(raised[0])


def _exception_of(call: Callable[[], object]) -> list[BaseException]:
    try:
        call()
    except BaseException as exc:
        return [exc]
    return []


def test_an_invocation_starts_no_thread_once_warm(
    stub_env: OpenAIStub, make_session: MakeSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The graph runs on a greenlet of the caller's thread (handlers/langgraph/streaming.py), not on
    # threads of its own or a pool built per call.
    list(stream_turn(get_agent_handler(make_session()), "warm up [words: 3]"))
    started: list[str] = []
    original = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        starter = threading.current_thread()
        # The stub server starts one per request on its own thread; only the handler's count here.
        if starter is threading.main_thread():
            started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for i in range(3):
        events = stream_turn(get_agent_handler(make_session()), f"call {i} [words: 4]")
        texts = [e.text for e in events if e.kind == "text"]
        assert "".join(texts) == "w1 w2 w3 w4"
    assert started == []
