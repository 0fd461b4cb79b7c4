"""Running a plain handler (one written to `BaseAgentHandler` alone) as a stream of chatq events.

A plain handler gets the message as sent (`stream(user_message, images, reply_to)`, else
`invoke(...)` when `stream` raises NotImplementedError) and knows nothing of chatq's leases,
cancels or turn timeout. So it runs on a thread of its own, in a copy of the caller's context
(the turn's abort signal and `running_turn` stay visible to it), and the caller waits for its
events: between them, and at least every `POLL_SECONDS`, the caller runs `check` (the worker's
lease check, which raises for a cancel, a lost lease or a shutdown); an abort of the turn's signal
wakes it at once; past the turn timeout it raises TurnTimeout. When the caller stops waiting, the
handler's stream is closed at its next event; a call it is blocked in runs on until it returns
(unless it stops itself through `current_abort()`), and its result is dropped.

What the handler yields or returns is brought to chatq's types here: its events to
`StreamEvent`, its messages (`AgentMessage`, another class with the same fields, or dicts
`{"role", "content", ...}`) to `AgentMessage`. Anything that is not a message is left as it is,
for the worker to refuse as "no reply" (`worker/runtime/delivery/replies.py`). No agent framework is
imported here.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from handlers.abort import current_abort
from handlers.base import BaseAgentHandler
from handlers.deadline import Deadline
from handlers.messages import AgentMessage, StreamEvent, StreamEventKind

__all__ = ["POLL_SECONDS", "as_agent_message", "as_stream_event", "plain_events"]

POLL_SECONDS = 0.5
"""Longest wait for a plain handler's next event before `check` runs again (an abort wakes it sooner)."""

_DONE, _WAKE, _END = object(), object(), object()


def plain_events(
    handler: BaseAgentHandler,
    user_message: str,
    *,
    images: Sequence[str] | None,
    reply_to: int | None,
    timeout: float,
    check: Callable[[], None],
) -> Iterator[StreamEvent]:
    """The events of one invocation of `handler`, run on its own thread (see the module's docstring).

    A handler without `stream` gives one "final" event from `invoke`. Exceptions of the handler
    are raised here as they are; TurnTimeout once `timeout` seconds have passed.
    """
    deadline = Deadline(timeout)
    items: queue.SimpleQueue[object] = queue.SimpleQueue()
    stop = threading.Event()

    def pump() -> None:
        try:
            for event in _handler_events(handler, user_message, images, reply_to):
                items.put(event)
                if stop.is_set():
                    return  # leaving the loop closes the handler's stream, on this thread
        except BaseException as exc:  # handed to the waiting caller, which raises it
            items.put(exc)
        else:
            items.put(_DONE)

    signal = current_abort()
    key = signal.watch(lambda: items.put(_WAKE)) if signal is not None else None
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(pump,), name="chatq-plain-handler", daemon=True).start()
    try:
        while True:
            try:
                item = items.get(timeout=max(min(POLL_SECONDS, deadline.remaining()), 0.001))
            except queue.Empty:
                item = _WAKE
            check()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            deadline.check()
            if item is not _WAKE:
                yield item  # type: ignore[misc]  # only StreamEvents are put besides the markers
    finally:
        stop.set()
        if signal is not None and key is not None:
            signal.unwatch(key)


def _handler_events(
    handler: BaseAgentHandler, user_message: str, images: Sequence[str] | None, reply_to: int | None
) -> Iterator[StreamEvent]:
    """`handler.stream(...)` as chatq events, or one final event from `invoke` when it has no `stream`."""
    try:
        stream = iter(handler.stream(user_message, images, reply_to))
        # A generator's NotImplementedError comes with its first event.
        first = next(stream, _END)
    except NotImplementedError:
        result: Any = handler.invoke(user_message, images, reply_to)
        messages, usage = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
        yield as_stream_event(StreamEvent(kind=StreamEventKind.FINAL, response=messages, usage=usage))
        return
    try:
        if first is _END:
            return
        yield as_stream_event(first)
        for item in stream:
            yield as_stream_event(item)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def _field(item: object, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def as_stream_event(item: object) -> StreamEvent:
    """A plain handler's event (a `StreamEvent` or any object or dict with its fields) as a chatq `StreamEvent`."""
    kind = str(_field(item, "kind") or "")
    if kind == StreamEventKind.TEXT:
        return StreamEvent(kind=StreamEventKind.TEXT, text=str(_field(item, "text") or ""))
    if kind == StreamEventKind.TOOL:
        tool = _field(item, "tool")
        return StreamEvent(kind=StreamEventKind.TOOL, tool=dict(tool) if isinstance(tool, Mapping) else None)
    if kind == StreamEventKind.FINAL:
        response = _field(item, "response")
        if isinstance(response, list | tuple):
            response = [as_agent_message(message) for message in response]
        usage = _field(item, "usage")
        return StreamEvent(
            kind=StreamEventKind.FINAL, response=response, usage=dict(usage) if isinstance(usage, Mapping) else None
        )
    return StreamEvent(kind=kind)  # a kind chatq does not know: relayed to nobody


def as_agent_message(item: object) -> object:
    """`item` as an `AgentMessage` when it is one by its fields (`role`, `content`, ...), else unchanged."""
    if isinstance(item, AgentMessage):
        return item
    role = _field(item, "role")
    if not isinstance(role, str) or not role or (not isinstance(item, Mapping) and not hasattr(item, "content")):
        return item
    content = _field(item, "content")
    tool_calls = _field(item, "tool_calls")
    citations = _field(item, "citations")
    tool_call_id = _field(item, "tool_call_id")
    try:
        return AgentMessage(
            role=role,
            content=content if isinstance(content, str) else str(content or ""),
            tool_calls=[dict(call) for call in tool_calls] if tool_calls else None,
            tool_call_id=str(tool_call_id) if tool_call_id is not None else None,
            citations=[dict(citation) for citation in citations] if citations else None,
        )
    except (TypeError, ValueError):  # tool calls or citations that are not dicts: not a message
        return item
