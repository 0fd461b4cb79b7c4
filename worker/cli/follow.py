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
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(session_channel(session_id))
    try:
        while True:
            message = pubsub.get_message(timeout=1.0)
            if message is None or message.get("type") != "message":
                continue
            yield json.loads(message["data"])
    finally:
        pubsub.close()


class EventPrinter:
    """Renders events for a person: reply text inline, tools and retries as short notes on stderr."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, *, json_lines: bool = False) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.json_lines = json_lines
        self._mid_line = False

    def __call__(self, event: Event) -> None:
        if self.json_lines:
            self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
            self.out.flush()
            return
        kind = event.get("type")
        if kind == EventType.TEXT:
            self.out.write(str(event.get("text", "")))
            self.out.flush()
            self._mid_line = True
        elif kind == EventType.TOOL:
            tool = event.get("tool") or {}
            self._note(f"[tool {tool.get('name')} {tool.get('status')}]")
        elif kind == EventType.RETRY and event.get("waiting"):
            # The model service (or the model's shared limits) said "not now": nothing failed.
            self._note(f"[waiting: {event.get('error')}]")
        elif kind == EventType.RETRY:
            # The error comes last: it is a sentence of its own, with its own full stop.
            self._note(f"[attempt {event.get('attempt')} failed, retrying: {event.get('error')}]")
        elif kind == EventType.FINAL:
            if not self._mid_line:
                # Nothing streamed (a handler without stream()): print the stored reply.
                replies = [m for m in event.get("messages") or [] if m.get("role") == "assistant"]
                if replies:
                    self.out.write(str(replies[-1].get("content", "")))
            self.out.write("\n")
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
