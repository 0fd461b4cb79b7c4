"""The session's event source (`GET /sessions/{id}/events`) and its resume cursor.

Events of several turns interleave (a turn's `queued` event arrives while an earlier turn is still
streaming), so one `seq` cannot say where a client stopped. Each frame's `id:` is a cursor,
`W:S[,P:S]...` (see `SessionCursor`): turn positions with the last `seq` delivered. The source
subscribes to the pub/sub channel first and waits for Redis to confirm, then replays the turns at
and after the cursor from their replay streams, then forwards live messages, dropping the ones
already delivered and filling any gap from the replay stream. Nothing published after the
subscription can be missed, and nothing is sent twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import redis.asyncio as aioredis

from chatq.masking import mask_secrets
from worker.events import session_channel, turn_stream
from worker.gateway.sse import (
    RETRY_MS,
    encode_comment,
    encode_frame,
    encode_retry,
    event_seq,
    is_terminal,
    parse_event,
    read_entries,
)

__all__ = ["MAX_CURSOR_CHARS", "MAX_CURSOR_ENTRIES", "SessionCursor", "session_events"]

log = logging.getLogger(__name__)

MAX_CURSOR_CHARS = 16_384
MAX_CURSOR_ENTRIES = 1_000


@dataclass
class SessionCursor:
    """Where a session stream stands: `W:S[,P:S]...` in the SSE `id:` field.

    `W` (the watermark) is the lowest turn position not known to be delivered to its end; turns
    before it are done. Each `P:S` says turn position `P` was delivered up to `seq` `S`; a turn
    at or after `W` that is not listed was delivered nothing. The first entry is always `W:S`.
    """

    watermark: int
    seen: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    @classmethod
    def parse(cls, value: str) -> SessionCursor:
        """Read a cursor back from Last-Event-ID; ValueError for anything else."""
        text = value.strip()
        if not text or len(text) > MAX_CURSOR_CHARS:
            raise ValueError("Last-Event-ID of a session stream must be a cursor like '3:7' (position:seq)")
        seen: dict[int, int] = {}
        parts = text.split(",")
        if len(parts) > MAX_CURSOR_ENTRIES:
            raise ValueError("Last-Event-ID of a session stream has too many entries")
        for part in parts:
            position, colon, seq = part.strip().partition(":")
            if not colon or not position.isdigit() or not seq.isdigit() or len(position) > 12 or len(seq) > 18:
                raise ValueError(f"Last-Event-ID of a session stream must look like '3:7,4:1', got {value[:60]!r}")
            seen[int(position)] = max(int(seq), seen.get(int(position), 0))
        watermark = min(seen)
        return cls(watermark=watermark, seen={p: s for p, s in seen.items() if s > 0 or p == watermark})

    def last_seq(self, position: int) -> int:
        """The last `seq` delivered of the turn at `position` (0: none)."""
        return self.seen.get(position, 0)

    def wants(self, position: int, seq: int) -> bool:
        """True if that event has not been delivered yet."""
        return position >= self.watermark and position not in self.done and seq > self.last_seq(position)

    def advance(self, position: int, seq: int, *, terminal: bool) -> None:
        """Record one delivered event."""
        self.seen[position] = seq
        if terminal:
            self.finish(position)

    def finish(self, position: int) -> None:
        """Record that a turn was delivered to its end; move the watermark past finished turns."""
        if position < self.watermark:
            return
        self.done.add(position)
        while self.watermark in self.done:
            self.done.discard(self.watermark)
            self.seen.pop(self.watermark, None)
            self.watermark += 1

    def __str__(self) -> str:
        entries = [(self.watermark, self.last_seq(self.watermark))]
        entries.extend(sorted((p, s) for p, s in self.seen.items() if p > self.watermark))
        return ",".join(f"{p}:{s}" for p, s in entries)


async def _await_subscription(pubsub: Any, timeout: float = 5.0) -> None:
    """Wait for Redis to confirm SUBSCRIBE: only then are later publications sure to reach us."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        message = await pubsub.get_message(timeout=remaining)
        if message is not None and message.get("type") == "subscribe":
            return
    raise TimeoutError("Redis did not confirm the subscription")


async def session_events(
    client: aioredis.Redis,
    session_id: str,
    *,
    cursor: SessionCursor | None,
    heartbeat: float,
    initial_cursor: Callable[[], Awaitable[SessionCursor]],
    turns_from: Callable[[int], Awaitable[list[tuple[str, int]]]],
    position_of: Callable[[str], Awaitable[int | None]],
) -> AsyncGenerator[bytes, None]:
    """SSE frames of a session: the turns at and after the cursor from their replay streams, then live.

    Without a cursor the stream starts at `initial_cursor()` (computed after subscribing).
    `turns_from(W)` lists the session's turns at positions >= W as (turn id, position) in order;
    `position_of(turn_id)` finds the position of a turn first seen live.
    """
    pubsub: Any = client.pubsub()
    try:
        await pubsub.subscribe(session_channel(session_id))
        await _await_subscription(pubsub)
        if cursor is None:
            cursor = await initial_cursor()
        yield encode_retry(RETRY_MS)
        positions: dict[str, int] = {}
        for turn_id, position in await turns_from(cursor.watermark):
            positions[turn_id] = position
            async for frame in _catch_up(client, turn_id, position, cursor, before=None):
                yield frame
        last_write = time.monotonic()
        while True:
            wait = max(0.001, heartbeat - (time.monotonic() - last_write))
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
            if message is None or message.get("type") != "message":
                if time.monotonic() - last_write >= heartbeat:
                    yield encode_comment("keepalive")
                    last_write = time.monotonic()
                continue
            raw = message.get("data")
            event = parse_event(raw)
            if event is None:
                continue
            live_turn, seq = event.get("turn_id"), event_seq(event)
            live_position = positions.get(live_turn) if isinstance(live_turn, str) else None
            if live_position is None and isinstance(live_turn, str):
                announced = event.get("position")
                valid = isinstance(announced, int) and not isinstance(announced, bool)
                live_position = announced if valid else await position_of(live_turn)
                if live_position is not None:
                    positions[live_turn] = live_position
            if live_position is None or seq is None or not isinstance(live_turn, str):
                # Not an event of a known turn: pass it on, without moving the cursor.
                yield encode_frame(str(raw))
                last_write = time.monotonic()
                continue
            position = live_position
            if not cursor.wants(position, seq):
                continue
            if seq > cursor.last_seq(position) + 1:
                async for frame in _catch_up(client, live_turn, position, cursor, before=seq):
                    yield frame
                if not cursor.wants(position, seq):
                    continue
            cursor.advance(position, seq, terminal=is_terminal(event))
            yield encode_frame(str(raw), event_id=str(cursor))
            last_write = time.monotonic()
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await pubsub.aclose()
            except Exception as exc:
                log.debug("closing a pub/sub connection failed: %s", mask_secrets(str(exc)))


async def _catch_up(
    client: aioredis.Redis, turn_id: str, position: int, cursor: SessionCursor, *, before: int | None
) -> AsyncIterator[bytes]:
    """Frames of one turn's replay stream the cursor has not delivered (those with seq < `before`)."""
    for _entry_id, raw, event in await read_entries(client, turn_stream(turn_id)):
        seq = event_seq(event)
        if seq is None:
            continue
        if before is not None and seq >= before:
            return
        terminal = is_terminal(event)
        if cursor.wants(position, seq):
            cursor.advance(position, seq, terminal=terminal)
            yield encode_frame(raw, event_id=str(cursor))
        elif terminal and position >= cursor.watermark:
            # Delivered before the reconnect: the turn is done, so the watermark may pass it.
            cursor.finish(position)
