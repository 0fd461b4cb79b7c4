"""The gateway's Server-Sent Events endpoints: one turn's events, and a session's events live.

Redis is read through `redis.asyncio` (no thread per open stream); Postgres, for a turn whose
replay stream has expired, is read in the thread pool. Both run behind the route table's prologue
(`worker/gateway/routing.py`), which accepts the token as `?access_token=` too.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import Response

from worker.errors import TurnNotFound
from worker.events import encode_event, turn_stream
from worker.gateway import store
from worker.gateway.routing import Call
from worker.gateway.session_stream import SessionCursor, session_events
from worker.gateway.sse import (
    FINISHED_STATUSES,
    RETRY_MS,
    EventStreamResponse,
    encode_frame,
    encode_retry,
    event_seq,
    is_terminal,
    parse_event,
    parse_last_event_id,
    terminal_from_report,
    turn_events,
)
from worker.gateway.state import last_event_id, threaded

__all__ = ["stream_session", "stream_turn"]


async def stream_turn(call: Call) -> Response:
    """The events of one turn as Server-Sent Events, from its first event to its terminal one."""
    from worker.queries import turn_report

    gateway, tenant, turn_id = call.gateway, call.tenant, call.turn_id
    raw_after = last_event_id(call.request)
    try:
        after = parse_last_event_id(raw_after) if raw_after is not None else 0
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    if tenant is not None and not await threaded(store.turn_exists, turn_id, tenant):
        # A scoped token reads only its tenant's turns; the same answer as for no turn at all.
        raise HTTPException(404, f"no such turn: {turn_id}")
    client = gateway.redis()
    newest: Any = await client.xrevrange(turn_stream(turn_id), count=1)
    if newest:
        event = parse_event(newest[0][1].get("event"))
        seq = event_seq(event) if event else None
        if event and is_terminal(event) and seq is not None and raw_after is not None and seq == after:
            return Response(status_code=204)  # the client has the terminal event: EventSource stops
    else:
        if not await threaded(store.turn_exists, turn_id):
            raise HTTPException(404, f"no such turn: {turn_id}")
        report = await threaded(turn_report, turn_id)
        if report["status"] in FINISHED_STATUSES:
            frame = encode_event(terminal_from_report(report))
            return EventStreamResponse(_single(frame), closing=gateway.closing)

    async def load_report() -> dict[str, Any] | None:
        try:
            return await threaded(turn_report, turn_id)
        except TurnNotFound:
            return None

    frames = turn_events(
        client, str(turn_id), after=after, heartbeat=gateway.settings.heartbeat, load_report=load_report
    )
    return EventStreamResponse(frames, closing=gateway.closing)


async def _single(data: str) -> AsyncGenerator[bytes, None]:
    yield encode_retry(RETRY_MS)
    yield encode_frame(data)


async def stream_session(call: Call) -> Response:
    """The events of every turn of a session as Server-Sent Events, live."""
    gateway, tenant, session_id = call.gateway, call.tenant, call.session_id
    raw_cursor = last_event_id(call.request)
    try:
        cursor = SessionCursor.parse(raw_cursor) if raw_cursor is not None else None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    if not await threaded(store.session_exists, session_id, tenant):
        raise HTTPException(404, f"no such session: {session_id}")
    client = gateway.redis()

    async def initial_cursor() -> SessionCursor:
        start, recent = await threaded(store.session_start, session_id)
        for turn_id, position in recent:
            newest: Any = await client.xrevrange(turn_stream(turn_id), count=1)
            event = parse_event(newest[0][1].get("event")) if newest else None
            if newest and (event is None or not is_terminal(event)):
                # Finished in Postgres, but its terminal event is not out yet: start with it.
                start = min(start, position)
                break
        return SessionCursor(watermark=start)

    async def turns_from(position: int) -> list[tuple[str, int]]:
        return await threaded(store.turns_from, session_id, position)

    async def position_of(turn_id: str) -> int | None:
        return await threaded(store.position_of, session_id, turn_id)

    frames = session_events(
        client,
        str(session_id),
        cursor=cursor,
        heartbeat=gateway.settings.heartbeat,
        initial_cursor=initial_cursor,
        turns_from=turns_from,
        position_of=position_of,
    )
    return EventStreamResponse(frames, closing=gateway.closing)
