"""Running a plain handler (written to `BaseAgentHandler` alone) as chatq events: `handlers.plain_run`.

The handlers here call no model and read no database; the worker's side (`check`, the abort
signal, the turn's context) is played by the test.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from typing import Any

import pytest

from handlers import plain_run
from handlers.abort import AbortSignal, abortable, current_abort
from handlers.base import AgentInvocationError, AgentMessage, BaseAgentHandler, SessionInfo, StreamEvent, Usage
from handlers.context import current_turn, running_turn
from handlers.errors import TurnTimeout
from handlers.plain_run import as_agent_message, as_stream_event, plain_events

SESSION = SessionInfo(id=uuid.uuid4(), agent_framework="ported", model="echo")
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


class Invoking(BaseAgentHandler):
    """Invoke only; records what it was called with."""

    def __init__(self, session: Any, reply: Callable[[str], Any] | None = None) -> None:
        super().__init__(session)
        self.reply = reply or (lambda text: ([AgentMessage(role="assistant", content=text)], dict(USAGE)))
        self.calls: list[tuple[str, Any, Any]] = []

    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        self.calls.append((user_message, images, reply_to))
        return self.reply(user_message)  # type: ignore[no-any-return]

    async def astream(self, user_message: str) -> AsyncGenerator[tuple[str, Usage], None]:
        yield "", {}


class Streaming(Invoking):
    """Also `stream`, from a list of events (or a callable making them)."""

    def __init__(self, session: Any, events: Callable[[], Iterator[Any]]) -> None:
        super().__init__(session)
        self.events = events
        self.closed = threading.Event()

    def stream(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> Iterator[Any]:
        self.calls.append((user_message, images, reply_to))
        try:
            yield from self.events()
        finally:
            self.closed.set()


def _run(handler: BaseAgentHandler, *, timeout: float = 30.0, check: Callable[[], None] = lambda: None) -> list[Any]:
    return list(plain_events(handler, "hi", images=["https://x.test/a.png"], reply_to=7, timeout=timeout, check=check))


def test_a_handler_without_stream_gives_one_final_event_from_invoke() -> None:
    handler = Invoking(SESSION)
    events = _run(handler)
    assert handler.calls == [("hi", ["https://x.test/a.png"], 7)]
    assert events == [StreamEvent(kind="final", response=[AgentMessage(role="assistant", content="hi")], usage=USAGE)]


def test_a_generator_stream_raising_not_implemented_falls_back_to_invoke() -> None:
    def none_yet() -> Iterator[Any]:
        raise NotImplementedError
        yield  # a generator

    handler = Streaming(SESSION, none_yet)
    assert [event.kind for event in _run(handler)] == ["final"]
    assert len(handler.calls) == 2  # stream, then invoke


def test_not_implemented_after_the_first_event_is_a_failure_not_a_fallback() -> None:
    def half() -> Iterator[Any]:
        yield StreamEvent(kind="text", text="a")
        raise NotImplementedError("half done")

    handler = Streaming(SESSION, half)
    with pytest.raises(NotImplementedError, match="half done"):
        _run(handler)
    assert len(handler.calls) == 1


def test_a_stream_is_relayed_in_order_in_chatq_types() -> None:
    @dataclasses.dataclass
    class PortedMessage:  # a ported handler's own message class, same fields
        role: str
        content: str
        tool_calls: list[dict[str, Any]] | None = None
        tool_call_id: str | None = None

    @dataclasses.dataclass
    class PortedEvent:
        kind: str
        text: str = ""
        tool: dict[str, Any] | None = None
        response: Any = None
        usage: dict[str, int] | None = None

    call = {"id": "c1", "name": "lookup", "args": {}}

    def events() -> Iterator[Any]:
        yield PortedEvent("text", text="Hel")
        yield {"kind": "tool", "tool": {"id": "c1", "name": "lookup", "status": "started"}}
        yield StreamEvent(kind="text", text="lo")
        messages = [
            PortedMessage("assistant", "", tool_calls=[call]),
            {"role": "tool", "content": "out", "tool_call_id": "c1"},
            AgentMessage(role="assistant", content="Hello"),
        ]
        yield PortedEvent("final", response=messages, usage=USAGE)

    relayed = _run(Streaming(SESSION, events))
    assert all(type(event) is StreamEvent for event in relayed)
    assert [(e.kind, e.text) for e in relayed] == [("text", "Hel"), ("tool", ""), ("text", "lo"), ("final", "")]
    assert relayed[1].tool == {"id": "c1", "name": "lookup", "status": "started"}
    assert relayed[-1].response == [
        AgentMessage(role="assistant", content="", tool_calls=[call]),
        AgentMessage(role="tool", content="out", tool_call_id="c1"),
        AgentMessage(role="assistant", content="Hello"),
    ]
    assert relayed[-1].usage == USAGE


def test_what_is_not_a_message_is_left_for_the_worker_to_refuse() -> None:
    assert as_agent_message("just text") == "just text"
    assert as_agent_message({"content": "no role"}) == {"content": "no role"}
    assert as_agent_message({"role": "assistant", "content": "x", "tool_calls": [1]}) == {
        "role": "assistant",
        "content": "x",
        "tool_calls": [1],
    }
    final = as_stream_event(StreamEvent(kind="final", response="not a list", usage=None))
    assert final.response == "not a list" and final.usage is None
    assert as_stream_event({"kind": "progress"}).kind == "progress"


def test_an_invoke_returning_no_pair_gives_what_it_returned_as_the_response() -> None:
    events = _run(Invoking(SESSION, reply=lambda _text: None))
    assert [(e.kind, e.response, e.usage) for e in events] == [("final", None, None)]


@pytest.mark.parametrize("error", [AgentInvocationError("model down"), RuntimeError("bug")])
def test_the_handlers_exception_is_raised_as_it_is(error: Exception) -> None:
    def fail(_text: str) -> Any:
        raise error

    with pytest.raises(type(error)) as info:
        _run(Invoking(SESSION, reply=fail))
    assert info.value is error


def test_the_handler_runs_in_the_callers_context_on_another_thread() -> None:
    seen: dict[str, Any] = {}

    def reply(text: str) -> Any:
        seen.update(abort=current_abort(), turn=current_turn(), thread=threading.get_ident())
        return [AgentMessage(role="assistant", content=text)], {}

    signal, turn_id = AbortSignal(), uuid.uuid4()
    with abortable(signal), running_turn(turn_id, 2):
        _run(Invoking(SESSION, reply=reply))
    assert seen["abort"] is signal and seen["turn"].turn_id == turn_id and seen["turn"].attempt == 2
    assert seen["thread"] != threading.get_ident()


class Stop(Exception):
    """What the worker's check raises (a cancel)."""


def test_check_stops_the_wait_while_the_handler_blocks_and_its_stream_is_closed() -> None:
    release, started = threading.Event(), threading.Event()

    def blocked() -> Iterator[Any]:
        yield StreamEvent(kind="text", text="a")
        started.set()
        release.wait(30)
        yield StreamEvent(kind="text", text="b")

    handler = Streaming(SESSION, blocked)
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1
        if started.is_set():
            raise Stop

    with pytest.raises(Stop):
        _run(handler, check=check)
    assert calls >= 1 and not handler.closed.is_set()  # still blocked: the waiting stopped, not the handler
    release.set()
    assert handler.closed.wait(10)  # its next event closes its stream, on its own thread


def test_an_abort_wakes_the_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_run, "POLL_SECONDS", 60.0)  # only the abort can wake it in time
    signal, started, release = AbortSignal(), threading.Event(), threading.Event()

    def reply(text: str) -> Any:
        started.set()
        release.wait(30)
        return [AgentMessage(role="assistant", content=text)], {}

    def check() -> None:
        if signal.aborted:
            raise Stop

    threading.Thread(target=lambda: started.wait(10) and signal.abort("cancelled"), daemon=True).start()
    begun = time.monotonic()
    try:
        with abortable(signal), pytest.raises(Stop):
            _run(Invoking(SESSION, reply=reply), check=check)
    finally:
        release.set()
    assert time.monotonic() - begun < 30  # not the 60 s poll


def test_a_handler_past_the_turn_timeout_fails_as_a_timeout() -> None:
    release = threading.Event()

    def reply(text: str) -> Any:
        release.wait(30)
        return [AgentMessage(role="assistant", content=text)], {}

    try:
        with pytest.raises(TurnTimeout, match="turn timeout"):
            _run(Invoking(SESSION, reply=reply), timeout=0.3)
    finally:
        release.set()
