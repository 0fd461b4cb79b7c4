"""Reading stream events back: following one turn (replay, then live) and watching a session."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import redis

from worker.errors import SessionNotFound, TurnNotFound
from worker.events import TERMINAL_TYPES, EventType, get_redis, session_channel, turn_stream

Event = dict[str, Any]


def follow_turn(
    turn_id: uuid.UUID,
    *,
    client: redis.Redis | None = None,
    finished: Callable[[], bool] | None = None,
    block_ms: int = 1000,
    idle_grace: float = 3.0,
) -> Iterator[Event]:
    """Yield a turn's events from the first one, live, until its terminal event.

    The replay stream makes this race-free: whether the consumer starts before, during or after
    the turn, it reads every event in order. If the stream is gone (retention ran out, Redis was
    flushed) and `finished()` says the turn ended, iteration stops; callers then read Postgres.
    """
    client = client or get_redis()
    key = turn_stream(turn_id)
    last_id = "0-0"
    quiet_since = time.monotonic()
    while True:
        batches: Any = client.xread({key: last_id}, block=block_ms, count=100)
        if not batches:
            if finished is not None and time.monotonic() - quiet_since > idle_grace and finished():
                return
            continue
        quiet_since = time.monotonic()
        for _key, entries in batches:
            for entry_id, fields in entries:
                last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                raw = fields.get(b"event") or fields.get("event")
                if raw is None:
                    continue
                event: Event = json.loads(raw)
                yield event
                if event.get("type") in TERMINAL_TYPES:
                    return


def require_session(session_id: uuid.UUID) -> None:
    """Raise SessionNotFound unless Postgres has the session (watching one that does not exist would be silent)."""
    from models.db import session_scope
    from models.tables import ChatSession

    with session_scope() as db:
        if db.get(ChatSession, session_id) is None:
            raise SessionNotFound(f"session {session_id} does not exist")


def require_turn(turn_id: uuid.UUID, *, client: redis.Redis | None = None) -> None:
    """Raise TurnNotFound unless the turn is in Postgres or has events in Redis.

    A producer stores a turn before it publishes or sends anything, and a worker stores a turn that
    arrived only through Redis before its first event, so a turn being submitted passes.
    """
    from models.db import session_scope
    from models.tables import Turn

    with session_scope() as db:
        if db.get(Turn, turn_id) is not None:
            return
    if not (client or get_redis()).exists(turn_stream(turn_id)):
        raise TurnNotFound(f"turn {turn_id} does not exist")


def watch_session(session_id: uuid.UUID, *, client: redis.Redis | None = None) -> Iterator[Event]:
    """Yield a session's live events from its pub/sub channel (until the caller stops)."""
    client = client or get_redis()
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2 on
    pubsub.subscribe(session_channel(session_id))
    try:
        while True:
            message = pubsub.get_message(timeout=1.0)
            if message is None or message.get("type") != "message":
                continue
            yield json.loads(message["data"])
    finally:
        pubsub.close()


_STORED_AS = {"succeeded": EventType.FINAL, "failed": EventType.ERROR, "cancelled": EventType.CANCELLED}


class EventPrinter:
    """Renders events for a person: reply text inline, tools and retries as short notes on stderr.

    The reply is printed once: streamed as `text` events, or from `final` (or from the stored turn,
    `stored`) only as far as the current attempt has not streamed it.
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, *, json_lines: bool = False) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.json_lines = json_lines
        self._mid_line = False
        self._streamed = ""
        """The text the current attempt streamed (a `retry` drops it: the next attempt starts over)."""

    def stored(self, report: Event) -> None:
        """End with the stored turn (`worker.queries.turn_report`) when no terminal event came.

        For a person it is printed as the terminal event its status stands for, so a reply that
        already streamed is not printed again; `json_lines` prints the report as one line.
        """
        if self.json_lines:
            self.out.write(json.dumps({"type": "report", **report}, default=str) + "\n")
            self.out.flush()
            return
        kind = _STORED_AS.get(str(report.get("status")))
        if kind is None:
            self._note(f"[{report.get('status')}]")
            return
        messages = [m for m in report.get("messages") or [] if m.get("role") != "user"]
        self({"type": kind.value, "messages": messages, "usage": report.get("usage"), "error": report.get("error")})

    def __call__(self, event: Event) -> None:
        if self.json_lines:
            self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
            self.out.flush()
            return
        kind = event.get("type")
        if kind == EventType.TEXT:
            text = str(event.get("text", ""))
            self.out.write(text)
            self.out.flush()
            self._mid_line = True
            self._streamed += text
        elif kind == EventType.TOOL:
            tool = event.get("tool") or {}
            self._note(f"[tool {tool.get('name')} {tool.get('status')}]")
        elif kind == EventType.RETRY and event.get("waiting"):
            # The model service (or the model's shared limits) said "not now": nothing failed.
            self._note(f"[waiting: {event.get('error')}]")
        elif kind == EventType.RETRY:
            self._streamed = ""
            # The error comes last: it is a sentence of its own, with its own full stop.
            self._note(f"[attempt {event.get('attempt')} failed, retrying: {event.get('error')}]")
        elif kind == EventType.FINAL:
            replies = [m for m in event.get("messages") or [] if m.get("role") == "assistant"]
            reply = str(replies[-1].get("content") or "") if replies else ""
            # Nothing streamed (a handler without stream()): the whole reply. Some streamed: only
            # what the reply adds to it, if it continues it (else the reply was the streamed text's
            # last part, after tool calls).
            rest = reply[len(self._streamed) :] if reply.startswith(self._streamed) else ""
            if rest or not self._streamed:
                self.out.write(rest)
                self._mid_line = True
            if self._mid_line:
                self.out.write("\n")
            self._streamed = ""
            self.out.flush()
            self._mid_line = False
            usage = event.get("usage") or {}
            prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            self._note(f"[done: {prompt} prompt + {completion} completion tokens]")
        elif kind == EventType.ERROR:
            self._note(f"[failed: {event.get('error')}]")
        elif kind == EventType.CANCELLED:
            self._note("[cancelled]")

    def _note(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False
        self.err.write(text + "\n")
        self.err.flush()
