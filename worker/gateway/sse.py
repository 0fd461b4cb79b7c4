"""Server-Sent Events: framing, resume cursors, and the two event sources (one turn, one session).

Turn stream (`GET /turns/{id}/events`): every frame's `id:` is the event's `seq`. The source reads
the turn's replay stream with XREAD from `0-0` and then keeps blocking on XREAD from the id of the
last entry it read, so the hand-over from replay to live has no gap and no overlap. After a
`Last-Event-ID: N` it skips events with `seq <= N`. It ends after the terminal event.

Session stream (`GET /sessions/{id}/events`): events of several turns interleave (a turn's
`queued` event arrives while an earlier turn is still streaming), so one `seq` cannot say where a
client stopped. Its `id:` is a cursor, `W:S[,P:S]...` (see `SessionCursor`): turn positions with
the last `seq` delivered. The source subscribes to the pub/sub channel first and waits for
Redis to confirm, then replays the turns at and after the cursor from their replay streams, then
forwards live messages, dropping the ones already delivered and filling any gap from the replay
stream. Nothing published after the subscription can be missed, and nothing is sent twice.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import redis.asyncio as aioredis
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from worker.config import mask_secrets
from worker.events import EVENT_VERSION, TERMINAL_TYPES, session_channel, turn_stream

log = logging.getLogger(__name__)

Event = dict[str, Any]
Report = dict[str, Any]

RETRY_MS = 1000
"""Sent as `retry:` so a browser reconnects one second after a dropped stream."""

IDLE_GRACE = 3.0
"""Seconds of quiet before a turn stream asks Postgres whether the turn already ended."""

READ_COUNT = 500
"""Replay-stream entries read per round trip."""

MAX_CURSOR_CHARS = 16_384
MAX_CURSOR_ENTRIES = 1_000

FINISHED_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
_STATUS_TERMINAL = {"succeeded": "final", "failed": "error", "cancelled": "cancelled"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

SSE_HEADERS = {
    "Cache-Control": "no-cache, no-store, no-transform",
    # nginx buffers proxied responses by default; this header turns that off per response.
    "X-Accel-Buffering": "no",
}


# --------------------------------------------------------------------------------------- framing


def encode_frame(data: str, *, event_id: str | None = None) -> bytes:
    """One SSE message: an optional `id:` line and the data, one `data:` line per line of it."""
    lines = [] if event_id is None else [f"id: {event_id}"]
    lines.extend(f"data: {line}" for line in _LINE_BREAK.split(data))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def encode_comment(text: str) -> bytes:
    """An SSE comment line (ignored by EventSource; keeps proxies from closing an idle stream)."""
    return f": {_LINE_BREAK.sub(' ', text)}\n\n".encode()


def encode_retry(milliseconds: int) -> bytes:
    """The reconnection delay a browser should use."""
    return f"retry: {milliseconds}\n\n".encode()


# ---------------------------------------------------------------------------------------- events


def parse_event(raw: object) -> Event | None:
    """A stream event from its JSON text, or None if it is not a JSON object."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def event_seq(event: Event) -> int | None:
    """The event's `seq` if it is a whole number."""
    seq = event.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def is_terminal(event: Event) -> bool:
    """True for `final`, `error` and `cancelled`."""
    return event.get("type") in TERMINAL_TYPES


def parse_last_event_id(value: str) -> int:
    """The `seq` of a turn stream's Last-Event-ID; ValueError if it is not a whole number."""
    text = value.strip()
    if not text.isdigit() or len(text) > 18:
        raise ValueError(f"Last-Event-ID must be the seq (a whole number) of a turn event, got {value[:60]!r}")
    return int(text)


def terminal_from_report(report: Report) -> Event:
    """The terminal event of a finished turn rebuilt from Postgres (its replay stream is gone).

    It has `"seq": null` and `"source": "postgres"`; `messages` and `usage` are as stored.
    """
    kind = _STATUS_TERMINAL[str(report["status"])]
    event: Event = {
        "v": EVENT_VERSION,
        "type": kind,
        "session_id": report["session_id"],
        "turn_id": report["id"],
        "attempt": report["attempts"],
        "seq": None,
        "ts": round(time.time(), 3),
        "source": "postgres",
    }
    if kind == "final":
        event["messages"] = [m for m in report["messages"] if m.get("role") != "user"]
        event["usage"] = report["usage"]
    elif kind == "error":
        event["error"] = report["error"] or "the turn failed"
    return event


def _json(event: Event) -> str:
    return json.dumps(event, separators=(",", ":"), default=str)


async def read_entries(client: aioredis.Redis, key: str, after_id: str = "0-0") -> list[tuple[str, str, Event]]:
    """Every entry of a replay stream after `after_id`: (entry id, raw JSON, event), in order."""
    result: list[tuple[str, str, Event]] = []
    cursor = after_id
    while True:
        batches: Any = await client.xread({key: cursor}, count=READ_COUNT)
        entries = _entries(batches)
        if not entries:
            return result
        result.extend(entries)
        cursor = entries[-1][0]
        if len(entries) < READ_COUNT:
            return result


def _entries(batches: Any) -> list[tuple[str, str, Event]]:
    """XREAD's reply as (entry id, raw JSON, event) tuples; entries without a JSON object are dropped."""
    found: list[tuple[str, str, Event]] = []
    for _key, entries in batches or []:
        for entry_id, fields in entries:
            raw = fields.get("event") if isinstance(fields, dict) else None
            event = parse_event(raw)
            if event is None:
                log.warning("replay entry %s has no event object; skipped", entry_id)
                found.append((str(entry_id), "", {}))
                continue
            found.append((str(entry_id), str(raw), event))
    return found


# ----------------------------------------------------------------------------- the turn's stream


async def turn_events(
    client: aioredis.Redis,
    turn_id: str,
    *,
    after: int,
    heartbeat: float,
    load_report: Callable[[], Awaitable[Report | None]],
    idle_grace: float = IDLE_GRACE,
) -> AsyncGenerator[bytes, None]:
    """SSE frames of one turn after `seq` `after`, live, until its terminal event.

    If the turn is finished in Postgres but no terminal event arrives (its replay stream expired
    or Redis lost it), the terminal event is rebuilt from Postgres so the stream still ends.
    """
    key = turn_stream(turn_id)
    last_id = "0-0"
    yield encode_retry(RETRY_MS)
    last_write = last_news = time.monotonic()
    finished_at: float | None = None
    report: Report | None = None
    check_after = max(idle_grace, heartbeat)
    while True:
        now = time.monotonic()
        wait = heartbeat - (now - last_write)
        if finished_at is not None:
            wait = min(wait, idle_grace - (now - finished_at))
        batches: Any = await client.xread({key: last_id}, count=READ_COUNT, block=max(1, int(wait * 1000)))
        entries = _entries(batches)
        if entries:
            last_news = time.monotonic()
            finished_at = None
            for entry_id, raw, event in entries:
                last_id = entry_id
                seq = event_seq(event)
                if not event or (seq is not None and seq <= after):
                    if event and is_terminal(event):
                        if seq is not None and seq < after:
                            # Numbered below what the client saw: Redis lost the stream mid-turn and
                            # numbering restarted. The end still counts: send it, without an id.
                            yield encode_frame(raw)
                        return
                    continue
                yield encode_frame(raw, event_id=None if seq is None else str(seq))
                last_write = time.monotonic()
                after = seq if seq is not None else after
                if is_terminal(event):
                    return
            continue
        now = time.monotonic()
        if finished_at is not None and now - finished_at >= idle_grace and report is not None:
            yield encode_frame(_json(terminal_from_report(report)))
            return
        if now - last_write >= heartbeat:
            yield encode_comment("keepalive")
            last_write = time.monotonic()
        if finished_at is None and now - last_news >= check_after:
            last_news = now
            report = await load_report()
            if report is not None and report.get("status") in FINISHED_STATUSES:
                # The terminal event may still be on its way: wait one more grace period for it.
                finished_at = time.monotonic()


# -------------------------------------------------------------------------- the session's stream


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


# -------------------------------------------------------------------------------- the response


class EventStreamResponse(Response):
    """A `text/event-stream` response fed by an async generator of frames.

    A task watches for the client going away and cancels the generator at once (instead of at
    its next write, which may be a heartbeat away), so its Redis connection is freed promptly.
    When `closing` is set (the server is shutting down) the stream ends cleanly, so clients
    reconnect at once (to another instance) instead of seeing a cut connection. An error inside
    the generator ends the stream too (it is logged): the client reconnects with `Last-Event-ID`
    and resumes where it was.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        *,
        closing: anyio.Event | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.frames = frames
        self.closing = closing
        self.status_code = 200
        self.background: BackgroundTask | None = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ended = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch_disconnect, receive, group.cancel_scope)
                if self.closing is not None:
                    group.start_soon(self._watch_closing, self.closing, group.cancel_scope)
                ended = await self._pump(send)
                group.cancel_scope.cancel()
            if not ended and self.closing is not None and self.closing.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away while we wrote
        finally:
            with anyio.CancelScope(shield=True):
                await self.frames.aclose()

    async def _pump(self, send: Send) -> bool:
        """Send the frames; True once the response is complete."""
        try:
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
        except OSError:
            return True
        except Exception as exc:
            log.warning("event stream ended early: %s: %s", type(exc).__name__, mask_secrets(str(exc)))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    @staticmethod
    async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    @staticmethod
    async def _watch_closing(closing: anyio.Event, scope: anyio.CancelScope) -> None:
        await closing.wait()
        scope.cancel()
