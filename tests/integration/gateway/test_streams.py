"""The SSE streams against a real gateway, worker, Redis and Postgres: order, resume, heartbeats, the end."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
import redis

from tests.integration.gateway.conftest import HEARTBEAT, STUB_MODEL, TOKEN, GatewayProcess
from tests.integration.gateway.sse_client import Frame, iter_frames, messages
from tests.support.turns import replay_events, wait_for_turn
from tests.support.workers import WorkerProcess
from worker.events import EventType, TurnEvents

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("worker")]

TERMINAL = ("final", "error", "cancelled")


def new_session(api: httpx.Client, model: str = STUB_MODEL) -> str:
    response = api.post("/sessions", json={"model": model})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def submit(api: httpx.Client, session_id: str, content: str, **extra: Any) -> str:
    response = api.post(f"/sessions/{session_id}/turns", json={"content": content, **extra})
    assert response.status_code == 202, response.text
    turn_id: str = response.json()["turn_id"]
    return turn_id


def read_turn(api: httpx.Client, turn_id: str, *, headers: dict[str, str] | None = None) -> list[Frame]:
    """Every message frame of a turn stream, until the server closes it."""
    with api.stream("GET", f"/turns/{turn_id}/events", headers=headers or {}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(messages(iter_frames(response)))


def test_a_turn_streams_every_event_in_order_and_the_stream_closes_after_the_end(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "count for me [words: 12]")
    frames = read_turn(api, turn_id)
    replay = replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))
    assert [frame.event for frame in frames] == replay
    assert [frame.id for frame in frames] == [str(event["seq"]) for event in replay]
    assert [event["type"] for event in replay][:2] == ["queued", "started"]
    assert replay[-1]["type"] == "final"
    text = "".join(event.get("text", "") for event in replay if event["type"] == "text")
    assert text == " ".join(f"w{i}" for i in range(1, 13))


def test_reconnecting_with_last_event_id_mid_stream_gets_exactly_the_missing_events(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "slowly [words: 30] [slow: 0.05]")
    first: list[Frame] = []
    with api.stream("GET", f"/turns/{turn_id}/events") as response:
        for frame in messages(iter_frames(response)):
            first.append(frame)
            if frame.event["type"] == "text" and len(first) >= 6:
                break  # drop the connection mid-reply
    assert first[-1].event["type"] == "text"
    time.sleep(0.3)  # events keep coming while we are away
    assert first[-1].id is not None
    rest = read_turn(api, turn_id, headers={"Last-Event-ID": first[-1].id})
    assert rest, "nothing after the reconnect"
    replay = replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))
    assert [frame.event for frame in first + rest] == replay
    assert int(rest[0].id or 0) == int(first[-1].id) + 1
    assert rest[-1].event["type"] == "final"


def test_last_event_id_as_a_query_parameter_and_the_header_wins(api: httpx.Client, chatq_env: dict[str, str]) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "[words: 6]")
    wait_for_turn(uuid.UUID(turn_id))
    replay = replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))
    with api.stream("GET", f"/turns/{turn_id}/events?last_event_id=3") as response:
        from_three = [frame.event for frame in messages(iter_frames(response))]
    assert from_three == replay[3:]
    with api.stream("GET", f"/turns/{turn_id}/events?last_event_id=1", headers={"Last-Event-ID": "4"}) as response:
        from_four = [frame.event for frame in messages(iter_frames(response))]
    assert from_four == replay[4:]


def test_a_reconnect_after_the_terminal_event_gets_204_so_eventsource_stops(api: httpx.Client) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "short [words: 2]")
    frames = read_turn(api, turn_id)
    last = frames[-1]
    assert last.event["type"] == "final" and last.id is not None
    response = api.get(f"/turns/{turn_id}/events", headers={"Last-Event-ID": last.id})
    assert response.status_code == 204
    assert response.content == b""
    # One before the end still gets the terminal event.
    again = read_turn(api, turn_id, headers={"Last-Event-ID": str(int(last.id) - 1)})
    assert [frame.event for frame in again] == [last.event]


def test_a_late_join_replays_the_whole_turn(api: httpx.Client, chatq_env: dict[str, str]) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "late [words: 5]")
    wait_for_turn(uuid.UUID(turn_id))
    frames = read_turn(api, turn_id)
    assert [frame.event for frame in frames] == replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))


def test_idle_streams_get_heartbeat_comments(api: httpx.Client) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "think first [sleep: 2.5]")
    comments = 0
    started = time.monotonic()
    with api.stream("GET", f"/turns/{turn_id}/events") as response:
        frames = iter_frames(response)
        assert next(frames).retry == 1000  # the first frame tells EventSource how soon to reconnect
        for frame in frames:
            if frame.comment is not None:
                assert frame.comment == "keepalive"
                comments += 1
            elif frame.event["type"] == "text":
                break
    waited = time.monotonic() - started
    assert comments >= int(waited / HEARTBEAT) - 2 >= 2


def test_a_turn_whose_replay_stream_expired_ends_with_its_terminal_event_from_postgres(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "remember me")
    wait_for_turn(uuid.UUID(turn_id))
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    try:
        client.delete(f"chatq:events:{turn_id}")
    finally:
        client.close()
    frames = read_turn(api, turn_id)
    assert len(frames) == 1
    event = frames[0].event
    assert frames[0].id is None
    assert event["type"] == "final" and event["source"] == "postgres" and event["seq"] is None
    assert event["turn_id"] == turn_id and event["session_id"] == session_id
    assert [m["content"] for m in event["messages"] if m["role"] == "assistant"] == ["You said: remember me"]
    assert event["usage"]["total_tokens"] > 0


def test_a_failed_turn_streams_retry_then_error(api: httpx.Client, chatq_env: dict[str, str]) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "doomed [fail]")
    frames = read_turn(api, turn_id)
    types = [frame.event["type"] for frame in frames]
    assert "retry" in types and types[-1] == "error"
    assert [frame.event for frame in frames] == replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))


def test_the_event_streams_accept_the_token_as_a_query_parameter(
    gateway: GatewayProcess, anonymous: httpx.Client, api: httpx.Client
) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "[words: 3]")
    assert anonymous.get(f"/turns/{turn_id}/events").status_code == 401
    assert anonymous.get(f"/turns/{turn_id}/events?access_token=wrong-{TOKEN}").status_code == 401
    with anonymous.stream("GET", f"/turns/{turn_id}/events?access_token={TOKEN}") as response:
        assert response.status_code == 200
        frames = list(messages(iter_frames(response)))
    assert frames[-1].event["type"] == "final"
    # Only the event streams: everything else wants the header.
    assert anonymous.get(f"/turns/{turn_id}?access_token={TOKEN}").status_code == 401
    with anonymous.stream("GET", f"/sessions/{session_id}/events?access_token={TOKEN}") as response:
        assert response.status_code == 200
    # The token never reaches the access log.
    time.sleep(0.2)
    assert TOKEN not in gateway.log()
    assert "access_token=***" in gateway.log()


def test_a_percent_encoded_token_parameter_is_redacted_from_the_access_log_too(
    gateway: GatewayProcess, anonymous: httpx.Client, api: httpx.Client
) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "[words: 2]")
    # Starlette decodes `access%5Ftoken` to `access_token`, so this authenticates like the plain form.
    with anonymous.stream("GET", f"/turns/{turn_id}/events?access%5Ftoken={TOKEN}") as response:
        assert response.status_code == 200
        assert list(messages(iter_frames(response)))[-1].event["type"] == "final"
    logged = f"/turns/{turn_id}/events?access%5Ftoken="
    deadline = time.monotonic() + 10
    while logged not in gateway.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"{logged}***" in gateway.log()
    assert TOKEN not in gateway.log()


def test_event_streams_of_unknown_turns_and_sessions_are_404(api: httpx.Client) -> None:
    for path in (f"/turns/{uuid.uuid4()}/events", f"/sessions/{uuid.uuid4()}/events", "/turns/nope/events"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert "no such" in response.json()["error"]


def test_a_bad_last_event_id_is_422(api: httpx.Client) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "[words: 1]")
    response = api.get(f"/turns/{turn_id}/events", headers={"Last-Event-ID": "seven"})
    assert response.status_code == 422
    assert "Last-Event-ID" in response.json()["error"]
    response = api.get(f"/sessions/{session_id}/events", headers={"Last-Event-ID": "3-x"})
    assert response.status_code == 422
    assert "Last-Event-ID" in response.json()["error"]


# ----------------------------------------------------------------------------------- sessions


def read_session_until(
    response: httpx.Response, done: set[str], *, stop_after: int | None = None
) -> tuple[list[Frame], bool]:
    """Session frames until every turn in `done` had its terminal event (or `stop_after` frames)."""
    frames: list[Frame] = []
    ended: set[str] = set()
    for frame in messages(iter_frames(response)):
        frames.append(frame)
        event = frame.event
        if event["type"] in TERMINAL:
            ended.add(event["turn_id"])
        if stop_after is not None and len(frames) >= stop_after:
            return frames, False
        if done <= ended:
            return frames, True
    return frames, False


def by_turn(frames: list[Frame]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for frame in frames:
        grouped.setdefault(frame.event["turn_id"], []).append(frame.event)
    return grouped


def test_a_session_stream_carries_every_turn_with_resumable_cursor_ids(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    with api.stream("GET", f"/sessions/{session_id}/events") as response:
        assert response.status_code == 200
        first = submit(api, session_id, "one [words: 8] [slow: 0.02]")
        second = submit(api, session_id, "two [words: 3]")
        frames, complete = read_session_until(response, {first, second})
    assert complete
    grouped = by_turn(frames)
    for turn_id in (first, second):
        assert grouped[turn_id] == replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))
    # Turn positions are 0 and 1: after both ended the cursor has moved past them.
    assert frames[-1].id == "2:0"
    assert all(frame.id for frame in frames)


def test_a_session_stream_resumes_from_its_cursor_with_nothing_lost_or_repeated(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    with api.stream("GET", f"/sessions/{session_id}/events") as response:
        first = submit(api, session_id, "one [words: 30] [slow: 0.1]")
        second = submit(api, session_id, "two [words: 4]")
        before, _ = read_session_until(response, {first, second}, stop_after=8)
    cursor = before[-1].id
    # Mid-way through turn 0, with turn 1 already queued: both are in the cursor.
    assert cursor is not None and cursor.startswith("0:") and ",1:1" in cursor, cursor
    time.sleep(0.5)
    with api.stream("GET", f"/sessions/{session_id}/events", headers={"Last-Event-ID": cursor}) as response:
        after, complete = read_session_until(response, {first, second})
    assert complete
    grouped = by_turn(before + after)
    for turn_id in (first, second):
        assert grouped[turn_id] == replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))


def test_a_session_stream_opened_mid_turn_starts_with_that_turn(api: httpx.Client, chatq_env: dict[str, str]) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "already going [words: 20] [slow: 0.05]")
    deadline = time.monotonic() + 20
    while api.get(f"/turns/{turn_id}").json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with api.stream("GET", f"/sessions/{session_id}/events") as response:
        frames, complete = read_session_until(response, {turn_id})
    assert complete
    assert [frame.event for frame in frames] == replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))


def test_a_session_stream_of_an_idle_session_starts_at_the_next_turn(api: httpx.Client) -> None:
    session_id = new_session(api)
    old = submit(api, session_id, "old [words: 2]")
    wait_for_turn(uuid.UUID(old))
    time.sleep(0.2)
    with api.stream("GET", f"/sessions/{session_id}/events") as response:
        new = submit(api, session_id, "new [words: 2]")
        frames, complete = read_session_until(response, {new})
    assert complete
    assert {frame.event["turn_id"] for frame in frames} == {new}


def test_closing_an_event_stream_frees_its_redis_subscription_at_once(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    channel = f"chatq:session:{session_id}"
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])

    def subscribers() -> int:
        counts: Any = client.pubsub_numsub(channel)
        return int(counts[0][1])

    try:
        with api.stream("GET", f"/sessions/{session_id}/events") as response:
            frames = iter_frames(response)
            assert next(frames).retry == 1000  # subscribed (the retry frame comes after the subscription)
            assert subscribers() == 1
        deadline = time.monotonic() + HEARTBEAT * 0.8 + 1.0
        while subscribers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert subscribers() == 0
    finally:
        client.close()


def test_cancelling_a_running_turn_ends_its_stream_with_cancelled(
    api: httpx.Client, worker: WorkerProcess, chatq_env: dict[str, str]
) -> None:
    session_id = new_session(api)
    turn_id = submit(api, session_id, "long [words: 200] [slow: 0.05]")
    with api.stream("GET", f"/turns/{turn_id}/events") as response:
        frames = iter_frames(response)
        seen: list[dict[str, Any]] = []
        for frame in messages(frames):
            seen.append(frame.event)
            if frame.event["type"] == "text":
                cancel = api.post(f"/turns/{turn_id}/cancel")
                assert cancel.status_code == 200 and cancel.json()["status"] == "running"
                break
        seen.extend(frame.event for frame in messages(frames))
    assert seen[-1]["type"] == "cancelled"
    assert seen == replay_events(chatq_env["REDIS_URL"], uuid.UUID(turn_id))
    assert json.loads(api.get(f"/turns/{turn_id}").text)["status"] == "cancelled"


def test_a_terminal_event_numbered_below_last_event_id_still_ends_the_turn_stream(
    api: httpx.Client, chatq_env: dict[str, str]
) -> None:
    """Redis lost the stream mid-turn and numbering restarted: the end must still get through."""
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    try:
        turn_id = uuid.uuid4()
        events = TurnEvents(session_id=uuid.uuid4(), turn_id=turn_id, client=client, retention=600)
        events.publish(EventType.STARTED, 1)
        events.publish(EventType.TEXT, 1, text="again")
        final = events.publish(EventType.FINAL, 1, messages=[], usage={})
    finally:
        client.close()
    frames = read_turn(api, str(turn_id), headers={"Last-Event-ID": "9"})
    assert [(frame.id, frame.event) for frame in frames] == [(None, final)]
    assert api.get(f"/turns/{turn_id}/events", headers={"Last-Event-ID": "3"}).status_code == 204
