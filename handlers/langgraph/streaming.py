"""Runs the compiled graph on a pooled thread and hands its output to the handler through one queue.

LangGraph's synchronous `stream_mode="messages"` (and `"custom"`) pass every token through two
threads: the node's executor thread puts it on LangGraph's stream queue, a waiter thread picks it
up, and the caller's thread wakes on the waiter's future. Each invocation also builds a thread
pool and two threads. Measured against the stub, that machinery was a quarter of the handler's CPU
(about 1.2 of 5 ms per call) and half of a chunk's time inside the handler.

Here the graph runs with `stream_mode="updates"`, which LangGraph executes inline on the calling
thread, and that thread is one of this module's pool. The agent node puts each text chunk on the
invocation's queue as it arrives (`TurnContext.on_text`), and the graph's updates follow on the
same queue. So a token crosses one thread, and chunks keep their order relative to the updates.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from handlers.deadline import Deadline

__all__ = ["GRAPH_THREADS", "TEXT", "UPDATES", "GraphRun", "run_graph"]

GRAPH_THREADS = 4096
"""Most graph runs one process keeps going at once (each needs a thread while it runs); more wait
for a free thread. Far above any worker's concurrency: threads start on demand and are reused."""

TEXT = "text"
"""Kind of a queued item that holds a token chunk's text."""
UPDATES = "updates"
"""Kind of a queued item that holds one LangGraph `updates` part ({node: state update})."""

_DONE = "done"
_FAILED = "failed"
_CLOSE_GRACE = 0.5
"""Seconds past the deadline the consumer waits for the graph before it reports the timeout itself."""

_executors: dict[int, ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    # One pool per process, built on first use: a pool inherited through fork has no threads.
    pid = os.getpid()
    with _executors_lock:
        executor = _executors.get(pid)
        if executor is None:
            _executors.clear()
            executor = ThreadPoolExecutor(max_workers=GRAPH_THREADS, thread_name_prefix="chatq-graph")
            _executors[pid] = executor
        return executor


class GraphRun:
    """One invocation's queue: the node thread puts, the handler's generator takes."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    def on_text(self, text: str) -> None:
        """Queue a token chunk's text (called on the graph's thread by the agent node)."""
        self._items.put((TEXT, text))

    def pump(self, graph: Any, graph_input: Any, config: Any) -> None:
        """Run the graph to its end, queueing every update, then the outcome."""
        try:
            for part in graph.stream(graph_input, config, stream_mode=UPDATES):
                self._items.put((UPDATES, part))
        except BaseException as exc:  # handed to the consumer, which raises it on its own thread
            self._items.put((_FAILED, exc))
        else:
            self._items.put((_DONE, None))

    def take(self, deadline: Deadline) -> tuple[str, Any] | None:
        """The next item; None once the graph has finished. Raises what the graph raised, or the
        deadline's error when nothing comes in time."""
        try:
            kind, value = self._items.get(timeout=deadline.remaining() + _CLOSE_GRACE)
        except queue.Empty:
            deadline.check()
            raise
        if kind == _FAILED:
            raise value
        if kind == _DONE:
            return None
        return kind, value


def run_graph(
    graph: Any, graph_input: Any, config: Any, run: GraphRun, deadline: Deadline
) -> Iterator[tuple[str, Any]]:
    """(TEXT, text) and (UPDATES, part) items of one graph run, in the order they happened.

    Leaving early (the consumer closed the generator, the deadline passed, the graph failed)
    stops the deadline, so the node still running ends at its next check, and waits for it: no
    graph work outlives its invocation.
    """
    context = contextvars.copy_context()  # logging and tool context follow the turn onto the thread
    future: Future[None] = _executor().submit(context.run, run.pump, graph, graph_input, config)
    try:
        while True:
            deadline.check()
            item = run.take(deadline)
            if item is None:
                return
            yield item
    finally:
        deadline.stop()
        future.result()
