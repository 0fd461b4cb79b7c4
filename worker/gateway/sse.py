"""Server-Sent Events: framing, event parsing, the turn's event source and the response.

Turn stream (`GET /turns/{id}/events`): every frame's `id:` is the event's `seq`. The source reads
the turn's replay stream with XREAD from `0-0` and then keeps blocking on XREAD from the id of the
last entry it read, so the hand-over from replay to live has no gap and no overlap. After a
`Last-Event-ID: N` it skips events with `seq <= N`. It ends after the terminal event.

The session stream (`GET /sessions/{id}/events`) is in `worker.gateway.session_stream`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio as aioredis
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from chatq.masking import mask_secrets
from worker.events import EVENT_VERSION, TERMINAL_TYPES, encode_event, turn_stream

log = logging.getLogger(__name__)

Event = dict[str, Any]
Report = dict[str, Any]

RETRY_MS = 1000
"""Sent as `retry:` so a browser reconnects one second after a dropped stream."""

IDLE_GRACE = 3.0
"""Seconds of quiet before a turn stream asks Postgres whether the turn already ended."""

READ_COUNT = 500
"""Replay-stream entries read per round trip."""

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
            yield encode_frame(encode_event(terminal_from_report(report)))
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
