"""`PreparedTurnHandler.invoke` and `astream`, derived from its template `stream_turn` (around an adapter's `run`).

No agent framework is imported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from typing import Any

from handlers.errors import EMPTY_REPLY, AgentInvocationError
from handlers.messages import AgentMessage, StreamEvent, StreamEventKind, Usage

__all__ = ["astream_from", "final_result"]


def final_result(events: Iterable[StreamEvent]) -> tuple[list[AgentMessage], Usage]:
    """Run a handler's `stream()` to its end and return what its final event carries (for `invoke`)."""
    for event in events:
        if event.kind == StreamEventKind.FINAL:
            return list(event.response), dict(event.usage or {})
    raise AgentInvocationError(EMPTY_REPLY)


_DONE = object()


async def astream_from(
    events: Callable[[], Iterator[StreamEvent]],
) -> AsyncGenerator[tuple[str, Usage], None]:
    """Async (chunk, usage) tuples from a sync event stream run on its own thread.

    The whole sync stream runs on one thread (LangChain keeps run context in context variables,
    which must not hop between threads mid-stream), in a copy of the caller's context (so the
    turn set by `handlers.context.running_turn` is seen there); events cross to the event loop
    through a queue. Text chunks come with `{}`; the last tuple is `("", usage)` with the totals.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()

    def put(item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody is listening
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        try:
            iterator = events()
            try:
                for event in iterator:
                    put(event)
                    if stop.is_set():
                        return
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put(exc)
        else:
            put(_DONE)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(pump,), name="chatq-astream", daemon=True).start()
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            if item.kind == StreamEventKind.TEXT and item.text:
                yield item.text, {}
            elif item.kind == StreamEventKind.FINAL:
                yield "", dict(item.usage or {})
    finally:
        stop.set()
