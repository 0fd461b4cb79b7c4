"""handlers/langgraph/streaming.py with real (tiny) LangGraph graphs: order, threads, context, failure, stop."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from handlers.deadline import Deadline
from handlers.errors import AgentInvocationError, ThreadHopError, TurnTimeout
from handlers.langgraph.streaming import TEXT, UPDATES, GraphRun, run_graph

_caller: contextvars.ContextVar[str] = contextvars.ContextVar("test_caller", default="unset")


class _State(TypedDict):
    seen: list[str]


def _graph(body: Callable[[_State, RunnableConfig], dict[str, Any]]) -> Any:
    builder = StateGraph(_State)
    builder.add_node("node", body)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    return builder.compile()


def _run(graph: Any, run: GraphRun, deadline: Deadline) -> list[tuple[str, Any]]:
    return list(run_graph(graph, {"seen": []}, {"configurable": {"run": run}}, run, deadline))


def test_text_comes_as_the_node_emits_it_and_before_the_node_update() -> None:
    emitted_while_running: list[bool] = []
    done = threading.Event()

    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        for word in ("a ", "b ", "c"):
            config["configurable"]["run"].on_text(word)
            time.sleep(0.05)
        done.set()
        return {"seen": ["a b c"]}

    run = GraphRun()
    items = []
    for kind, value in run_graph(_graph(node), {"seen": []}, {"configurable": {"run": run}}, run, Deadline(5)):
        emitted_while_running.append(not done.is_set())
        items.append((kind, value))
    assert items == [(TEXT, "a "), (TEXT, "b "), (TEXT, "c"), (UPDATES, {"node": {"seen": ["a b c"]}})]
    assert emitted_while_running[:2] == [True, True]  # streamed, not handed over after the node


def test_the_node_runs_on_the_callers_thread_in_the_callers_context_and_starts_no_thread() -> None:
    seen: list[tuple[str, int]] = []

    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        seen.append((_caller.get(), threading.get_ident()))
        _caller.set("changed by the node")  # stays inside the graph's run
        return {"seen": []}

    graph = _graph(node)
    _run(graph, GraphRun(), Deadline(5))
    threads = set(threading.enumerate())
    for i in range(5):
        token = _caller.set(f"turn {i}")
        try:
            _run(graph, GraphRun(), Deadline(5))
            assert _caller.get() == f"turn {i}"
        finally:
            _caller.reset(token)
    assert seen[1:] == [(f"turn {i}", threading.get_ident()) for i in range(5)]
    assert set(threading.enumerate()) == threads


def test_text_reaches_the_consumer_before_the_node_goes_on() -> None:
    """The chunk is relayed when on_text returns, not when the node next blocks (the last-chunk tail)."""
    received: list[str] = []
    relayed_in_time: list[bool] = []

    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        for word in ("a", "b", "c"):
            config["configurable"]["run"].on_text(word)
            relayed_in_time.append(received[-1:] == [word])
        return {"seen": []}

    run = GraphRun()
    for kind, value in run_graph(_graph(node), {"seen": []}, {"configurable": {"run": run}}, run, Deadline(5)):
        if kind == TEXT:
            received.append(value)
    assert received == ["a", "b", "c"]
    assert relayed_in_time == [True, True, True]


def test_text_from_nodes_langgraph_runs_on_its_own_threads_comes_before_their_updates() -> None:
    threads: set[int] = set()

    def make(name: str) -> Callable[[_State, RunnableConfig], dict[str, Any]]:
        def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
            threads.add(threading.get_ident())
            config["configurable"]["run"].on_text(name)
            return {}

        return node

    builder = StateGraph(_State)
    builder.add_node("left", make("left"))
    builder.add_node("right", make("right"))
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    builder.add_edge("left", END)
    builder.add_edge("right", END)
    run = GraphRun()
    items = _run(builder.compile(), run, Deadline(5))
    texts = [value for kind, value in items if kind == TEXT]
    assert sorted(texts) == ["left", "right"]
    for name in ("left", "right"):  # each node's text before its update
        assert items.index((TEXT, name)) < next(i for i, (kind, v) in enumerate(items) if kind == UPDATES and name in v)
    assert threads - {threading.get_ident()}  # two tasks in one step: LangGraph used its threads


def test_a_stream_advanced_on_another_thread_fails_with_a_clear_error() -> None:
    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        config["configurable"]["run"].on_text("x")
        return {"seen": []}

    run, deadline = GraphRun(), Deadline(5)
    items = run_graph(_graph(node), {"seen": []}, {"configurable": {"run": run}}, run, deadline)
    assert next(items) == (TEXT, "x")
    errors: list[BaseException] = []

    def advance() -> None:
        try:
            next(items)
        except BaseException as exc:
            errors.append(exc)

    other = threading.Thread(target=advance)
    other.start()
    other.join()
    assert len(errors) == 1 and isinstance(errors[0], ThreadHopError)
    assert "one thread" in str(errors[0])


def test_what_the_graph_raises_is_raised_to_the_consumer() -> None:
    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        raise ValueError("node broke")

    with pytest.raises(ValueError, match="node broke"):
        _run(_graph(node), GraphRun(), Deadline(5))


def test_closing_early_stops_the_node_and_waits_for_it() -> None:
    finished = threading.Event()

    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        deadline: Deadline = config["configurable"]["deadline"]
        try:
            for _ in range(500):
                config["configurable"]["run"].on_text("x")
                time.sleep(0.01)
                deadline.check()
        finally:
            finished.set()
        return {"seen": []}

    run, deadline = GraphRun(), Deadline(30)
    items = run_graph(_graph(node), {"seen": []}, {"configurable": {"run": run, "deadline": deadline}}, run, deadline)
    assert next(items) == (TEXT, "x")
    started = time.monotonic()
    items.close()  # type: ignore[attr-defined]
    assert finished.is_set()  # the node ended before close() returned
    assert time.monotonic() - started < 1.0  # where it waited, not after the 5 s it would run
    with pytest.raises(AgentInvocationError):
        deadline.check()


def test_a_silent_node_times_out_and_is_waited_for() -> None:
    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        time.sleep(1.0)  # checks nothing, like a blocking call that ignores the deadline
        return {"seen": []}

    started = time.monotonic()
    with pytest.raises(TurnTimeout):
        _run(_graph(node), GraphRun(), Deadline(0.1))
    assert time.monotonic() - started >= 0.95  # no graph work outlives its invocation
