"""The gateway's Server-Sent Events endpoints: one turn's events, and a session's events live.

Redis is read through `redis.asyncio` (no thread per open stream); Postgres, for a turn whose
replay stream has expired, is read in the thread pool.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from worker.errors import TurnNotFound
from worker.events import encode_event, turn_stream
from worker.gateway import store
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
from worker.gateway.state import gateway_of, last_event_id, path_uuid, threaded

__all__ = ["stream_session", "stream_turn"]


async def stream_turn(request: Request) -> Response:
    """The events of one turn as Server-Sent Events, from its first event to its terminal one.
    ---
    summary: Stream a turn's events (SSE)
    description: >-
      Each message has `id:` = the event's `seq` and `data:` = the event's JSON. With
      `Last-Event-ID: N` (EventSource sends it when it reconnects) the stream resumes after event N
      with nothing lost or repeated. The stream closes after the `final`, `error` or `cancelled`
      event; a reconnect after that gets 204 (which tells EventSource to stop). If the turn's replay
      stream has expired, its terminal event is rebuilt from Postgres (`"seq": null`, `"source": "postgres"`).
    tags: [events]
    security: [{bearer: []}, {accessToken: []}]
    parameters:
      - {$ref: "#/components/parameters/TurnId"}
      - {$ref: "#/components/parameters/LastEventIdHeader"}
      - {$ref: "#/components/parameters/LastEventIdQuery"}
      - {$ref: "#/components/parameters/AccessToken"}
    responses:
      "200": {$ref: "#/components/responses/EventStream"}
      "204": {description: the turn ended at or before Last-Event-ID}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    from worker.queries import turn_report

    gateway = gateway_of(request)
    tenant = gateway.authorize(request, query_ok=True)
    turn_id = path_uuid(request, "turn_id", "turn")
    raw_after = last_event_id(request)
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


async def stream_session(request: Request) -> Response:
    """The events of every turn of a session as Server-Sent Events, live.
    ---
    summary: Stream a session's events (SSE)
    description: >-
      A new stream starts with the session's unfinished turns from their first event (so a page
      opened mid-reply sees the whole reply), then follows the session live; it never ends by itself.
      Each message's `id:` is a cursor `W:S[,P:S]...` (turn positions with the last `seq` delivered;
      turns before position W are complete). Reconnecting with it as `Last-Event-ID` resumes with
      nothing lost or repeated, as long as the turns' replay streams are kept (CHATQ_EVENT_RETENTION).
    tags: [events]
    security: [{bearer: []}, {accessToken: []}]
    parameters:
      - {$ref: "#/components/parameters/SessionId"}
      - {$ref: "#/components/parameters/LastEventIdHeader"}
      - {$ref: "#/components/parameters/LastEventIdQuery"}
      - {$ref: "#/components/parameters/AccessToken"}
    responses:
      "200": {$ref: "#/components/responses/EventStream"}
      "401": {$ref: "#/components/responses/Error401"}
      "404": {$ref: "#/components/responses/Error404"}
      "422": {$ref: "#/components/responses/Error422"}
      "503": {$ref: "#/components/responses/Error503"}
    """
    gateway = gateway_of(request)
    tenant = gateway.authorize(request, query_ok=True)
    session_id = path_uuid(request, "session_id", "session")
    raw_cursor = last_event_id(request)
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


# ------------------------------------------------------------------------------ errors, the app
