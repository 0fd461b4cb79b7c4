"""Runs the compiled graph on a greenlet of the caller's thread, so each token reaches the handler's
generator without crossing a thread.

LangGraph's synchronous `stream_mode="messages"` (and `"custom"`) pass every token through two
threads: the node's executor thread puts it on LangGraph's stream queue, a waiter thread picks it
up, and the caller's thread wakes on the waiter's future. Each invocation also builds a thread
pool and two threads. Handing tokens to a consumer thread through a queue of our own is cheaper
but still costs a GIL hand-off per token: the graph's thread keeps the GIL until it next blocks,
so a reply's last chunk, which arrives together with the finish and usage chunks, waited for the
node to build its whole reply (against the stub, that wait was the whole p99 of chatq's stream
latency; BENCHMARKS.md has the figures).

Here the graph runs with `stream_mode="updates"`, which LangGraph executes inline on the calling
thread, inside a greenlet (the coroutine switch SQLAlchemy's asyncio bridge uses). The agent node
hands each text chunk to `GraphRun.on_text`, which switches to the handler's generator; the
generator yields it and switches back when it is asked for the next item. So a chunk is relayed
the moment it is parsed, in order with the graph's updates, with no thread, queue or lock per
invocation or per token.

One rule follows: the handler's generator must be advanced on one thread (a greenlet cannot move
between threads). WSGI servers, Django's StreamingHttpResponse, Celery and `astream()` all do; a
consumer that hops threads gets a one-line error instead of a hang.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import greenlet

from handlers.deadline import Deadline
from handlers.errors import ThreadHopError

__all__ = ["TEXT", "TOOL", "UPDATES", "GraphRun", "run_graph"]

TEXT = "text"
"""Kind of an item that holds a token chunk's text."""
TOOL = "tool"
"""Kind of an item that holds `(call id, tool name)` of a call the tool node is about to run."""
UPDATES = "updates"
"""Kind of an item that holds one LangGraph `updates` part ({node: state update})."""

_DONE = "done"
_FAILED = "failed"


class GraphRun:
    """One invocation's hand-off between the graph's greenlet and the handler's generator."""

    def __init__(self) -> None:
        self._runner: greenlet.greenlet | None = None
        self._consumer: greenlet.greenlet | None = None
        self._thread = 0
        # Items from a node LangGraph ran on one of its own threads (only when several tasks run in
        # one step, never for chatq's graph): held until the graph's next item, never lost.
        self._elsewhere: list[tuple[str, Any]] = []
        self._elsewhere_lock = threading.Lock()

    def on_text(self, text: str) -> None:
        """Hand a token chunk's text to the consumer (called by the agent node as chunks arrive)."""
        self._hand((TEXT, text))

    def on_tool(self, call_id: str, name: str) -> None:
        """Tell the consumer a call is about to run (called by the tool node, after the round's gate)."""
        self._hand((TOOL, (call_id, name)))

    def _hand(self, item: tuple[str, Any]) -> None:
        if self._runner is not None and greenlet.getcurrent() is self._runner:
            self._to_consumer(item)
        else:
            with self._elsewhere_lock:
                self._elsewhere.append(item)

    def start(self, graph: Any, graph_input: Any, config: Any) -> None:
        """Prepare the graph's greenlet on this thread; it first runs at `next_item()`."""
        self._consumer = greenlet.getcurrent()
        self._thread = threading.get_ident()
        self._runner = greenlet.greenlet(lambda: self._pump(graph, graph_input, config), parent=self._consumer)
        # Logging and tool context variables follow the turn into the graph (a greenlet starts empty).
        self._runner.gr_context = contextvars.copy_context()

    def next_item(self) -> tuple[str, Any] | None:
        """Run the graph until its next item; None once it has finished. Raises what it raised."""
        if self._runner is None or self._runner.dead:
            return None
        if threading.get_ident() != self._thread:
            raise ThreadHopError
        kind, value = self._runner.switch()
        if kind == _FAILED:
            raise value
        if kind == _DONE:
            return None
        return kind, value

    def close(self) -> None:
        """End the graph where it is waiting (at a hand-off), unwinding its node; no-op once ended."""
        runner = self._runner
        if runner is not None and not runner.dead:
            with contextlib.suppress(greenlet.error):  # closed from another thread: greenlet ends it later
                runner.throw()

    def _pump(self, graph: Any, graph_input: Any, config: Any) -> tuple[str, Any]:
        try:
            for part in graph.stream(graph_input, config, stream_mode=UPDATES):
                self._to_consumer((UPDATES, part))
        except greenlet.GreenletExit:
            raise  # close(): nobody is listening any more
        except BaseException as exc:  # handed to the consumer, which raises it
            return self._with_elsewhere((_FAILED, exc))
        return self._with_elsewhere((_DONE, None))

    def _to_consumer(self, item: tuple[str, Any]) -> None:
        assert self._consumer is not None
        self._consumer.switch(self._with_elsewhere(item))

    def _with_elsewhere(self, item: tuple[str, Any]) -> tuple[str, Any]:
        if self._elsewhere:
            with self._elsewhere_lock:
                held, self._elsewhere = self._elsewhere, []
            for held_item in held:
                assert self._consumer is not None
                self._consumer.switch(held_item)
        return item


def run_graph(
    graph: Any, graph_input: Any, config: Any, run: GraphRun, deadline: Deadline
) -> Iterator[tuple[str, Any]]:
    """(TEXT, text), (TOOL, (call id, name)) and (UPDATES, part) items of one graph run, in the order they happened.

    Leaving early (the consumer closed the generator, the deadline passed, the graph failed)
    stops the deadline and ends the graph where it waits, so no graph work outlives its
    invocation. A node that blocks past the deadline is waited for (the model call's own timeout
    is the remaining time); the timeout is raised when it returns.
    """
    run.start(graph, graph_input, config)
    try:
        while True:
            deadline.check()
            item = run.next_item()
            if item is None:
                return
            yield item
    finally:
        deadline.stop()
        run.close()
