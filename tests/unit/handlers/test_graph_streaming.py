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
from handlers.errors import AgentInvocationError, TurnTimeout
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


def _graph_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("chatq-graph")}


def test_the_node_sees_the_callers_context_on_a_pooled_thread_and_no_thread_is_started_per_call() -> None:
    seen: list[tuple[str, str]] = []

    def node(state: _State, config: RunnableConfig) -> dict[str, Any]:
        seen.append((_caller.get(), threading.current_thread().name))
        return {"seen": []}

    graph = _graph(node)
    _run(graph, GraphRun(), Deadline(5))  # the pool has at least one thread from here on
    threads = _graph_threads()
    for i in range(5):
        token = _caller.set(f"turn {i}")
        try:
            _run(graph, GraphRun(), Deadline(5))
        finally:
            _caller.reset(token)
    assert [value for value, _ in seen[1:]] == [f"turn {i}" for i in range(5)]
    assert {name for _, name in seen[1:]} <= threads  # idle pool threads took every call
    assert _graph_threads() == threads


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
    assert time.monotonic() - started < 1.0  # at its next check, not after the 5 s it would run
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
