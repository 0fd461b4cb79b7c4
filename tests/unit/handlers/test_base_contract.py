"""The handler contract's shape (`handlers.base.BaseAgentHandler`) and chatq's adapters' base on it."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from typing import Any

import pytest

from handlers import FRAMEWORK_CHOICES, load_handler_class, register_framework, unregister_framework
from handlers.base import AgentMessage, BaseAgentHandler, SessionInfo, StreamEvent, StreamEventKind, Usage
from handlers.errors import HandlerError, InvalidHandler
from handlers.prepared import PreparedTurnHandler, Reply
from handlers.turn_input import TurnInput

SESSION = SessionInfo(id=uuid.uuid4(), agent_framework="ported", model="echo")


class InvokeOnly(BaseAgentHandler):
    """A handler written to the contract: its two required methods."""

    def invoke(
        self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
    ) -> tuple[list[AgentMessage], Usage]:
        return [AgentMessage(role="assistant", content=user_message)], {"total_tokens": 1}

    async def astream(self, user_message: str) -> AsyncGenerator[tuple[str, Usage], None]:
        yield user_message, {}
        yield "", {"total_tokens": 1}


def _parameters(method: object) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(method).parameters.values()]  # type: ignore[arg-type]


def test_the_contract_is_invoke_and_astream_with_an_optional_stream() -> None:
    assert BaseAgentHandler.__abstractmethods__ == frozenset({"invoke", "astream"})
    empty = inspect.Parameter.empty
    call = [("self", empty), ("user_message", empty), ("images", None), ("reply_to", None)]
    assert _parameters(BaseAgentHandler.invoke) == call
    assert _parameters(BaseAgentHandler.stream) == call
    assert _parameters(BaseAgentHandler.astream) == [("self", empty), ("user_message", empty)]
    assert inspect.isasyncgenfunction(BaseAgentHandler.astream)
    assert _parameters(BaseAgentHandler.__init__) == [("self", empty), ("session", empty)]


def test_a_handler_with_invoke_and_astream_is_complete_and_has_no_stream() -> None:
    handler = InvokeOnly(SESSION)
    assert handler.session is SESSION
    with pytest.raises(NotImplementedError):
        handler.stream("hi")
    assert handler.invoke("hi") == ([AgentMessage(role="assistant", content="hi")], {"total_tokens": 1})

    async def chunks() -> list[tuple[str, Usage]]:
        return [chunk async for chunk in handler.astream("hi")]

    assert asyncio.run(chunks()) == [("hi", {}), ("", {"total_tokens": 1})]


def test_a_handler_missing_a_required_method_cannot_be_made() -> None:
    class StreamOnly(BaseAgentHandler):
        def stream(
            self, user_message: str, images: Sequence[str] | None = None, reply_to: int | None = None
        ) -> Iterator[StreamEvent]:
            yield StreamEvent(kind=StreamEventKind.FINAL, response=[], usage={})

    with pytest.raises(TypeError, match="abstract"):
        StreamOnly(SESSION)  # type: ignore[abstract]


def test_an_adapter_writes_only_run_and_honours_the_contract() -> None:
    class Adapter(PreparedTurnHandler):
        def run(self, turn: TurnInput) -> Generator[StreamEvent, None, Reply]:
            yield StreamEvent(kind=StreamEventKind.TEXT, text="x")
            return [AgentMessage(role="assistant", content="x")], {}

    assert PreparedTurnHandler.__abstractmethods__ == frozenset({"run"})
    adapter = Adapter(SESSION)
    assert isinstance(adapter, BaseAgentHandler)
    assert inspect.isasyncgen(adapter.astream("hi"))  # created, not started: nothing runs
    assert _parameters(Adapter.stream) == _parameters(BaseAgentHandler.stream)
    assert _parameters(Adapter.invoke) == _parameters(BaseAgentHandler.invoke)


@pytest.mark.parametrize("framework", [name for name, _ in FRAMEWORK_CHOICES])
def test_chatq_adapters_are_prepared_turn_handlers(framework: str) -> None:
    handler_class = load_handler_class(framework)
    assert issubclass(handler_class, PreparedTurnHandler)
    assert "run" in vars(handler_class)
    # The template and the contract's methods are the base's, never an adapter's own.
    assert not {"stream_turn", "stream", "invoke", "astream"} & set(vars(handler_class))


class WrittenForTheOldShape(BaseAgentHandler):
    """Only `stream(turn)`, as chatq's adapters were once written: the contract's methods are missing."""

    def stream(self, turn: Any, images: Any = None, reply_to: Any = None) -> Iterator[StreamEvent]:
        yield StreamEvent(kind=StreamEventKind.FINAL, response=[], usage={})


def test_registering_an_incomplete_handler_says_what_it_lacks() -> None:
    register_framework("incomplete", "Incomplete", f"{__name__}:WrittenForTheOldShape")
    register_framework("not_a_handler", "Not a handler", f"{__name__}:SESSION")
    try:
        with pytest.raises(InvalidHandler, match=r"'incomplete' .* does not implement astream, invoke\.$"):
            load_handler_class("incomplete")
        with pytest.raises(InvalidHandler, match=r"'not_a_handler' .* is not a BaseAgentHandler"):
            load_handler_class("not_a_handler")
    finally:
        unregister_framework("incomplete")
        unregister_framework("not_a_handler")
    assert issubclass(InvalidHandler, HandlerError)  # the runner fails such a turn at once, with this line
