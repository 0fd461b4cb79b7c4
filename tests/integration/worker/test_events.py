"""Stream events against the real Redis: numbering, replay stream, retention, hiccups."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import pytest
import redis

from chatq.settings import get_settings
from worker.event_scripts import UNENDED, ended_marker
from worker.events import (
    EventType,
    TextCoalescer,
    TurnEvents,
    get_redis,
    last_seq,
    make_redis,
    session_channel,
    turn_stream,
)


def test_events_are_published_and_kept_for_replay(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    session_id, turn_id = uuid.uuid4(), uuid.uuid4()
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(session_channel(session_id))
    time.sleep(0.1)
    events = TurnEvents(session_id=session_id, turn_id=turn_id, client=client, retention=900)
    events.publish(EventType.STARTED, 1)
    events.publish(EventType.TEXT, 1, text="hel")
    events.publish(
        EventType.FINAL, 1, messages=[], usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    )
    live = []
    deadline = time.monotonic() + 5
    while len(live) < 3 and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message:
            live.append(json.loads(message["data"]))
    stored = [json.loads(fields[b"event"]) for _id, fields in client.xrange(turn_stream(turn_id))]
    assert live == stored
    assert [e["seq"] for e in stored] == [1, 2, 3]
    assert [e["type"] for e in stored] == ["started", "text", "final"]
    assert 600 <= client.ttl(turn_stream(turn_id)) <= 900
    # Another worker taking the turn over continues the numbering.
    assert last_seq(client, turn_id) == 3
    resumed = TurnEvents.resume(
        session_id=session_id, turn_id=turn_id, client=get_redis(), retention=get_settings().event_retention
    )
    assert resumed.publish(EventType.RETRY, 2)["seq"] == 4
    pubsub.close()


def test_a_redis_outage_never_raises_from_publish(chatq_env: dict[str, str]) -> None:
    dead = make_redis("redis://127.0.0.1:1/0")
    events = TurnEvents(
        session_id=uuid.uuid4(), turn_id=uuid.uuid4(), client=dead, retention=get_settings().event_retention
    )
    started = time.monotonic()
    assert events.send([events.build(EventType.TEXT, 1, text="x")]) is False
    first_failure = time.monotonic() - started
    # While Redis is down, further chunks are dropped without another connection attempt...
    for _ in range(50):
        events.publish(EventType.TEXT, 1, text="y")
    assert time.monotonic() - started < first_failure * 5 + 0.5
    # ...but the terminal event is always attempted, and numbering goes on regardless.
    assert events.publish(EventType.FINAL, 1)["seq"] == 52


def test_text_coalescing_never_delays_the_first_chunk_and_merges_the_rest(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    turn_id = uuid.uuid4()
    events = TurnEvents(
        session_id=uuid.uuid4(), turn_id=turn_id, client=client, retention=get_settings().event_retention
    )
    coalescer = TextCoalescer(events, 1, window=10.0)
    for chunk in ["a", "b", "c", "d"]:
        coalescer.add(chunk)
    first = [json.loads(f[b"event"])["text"] for _i, f in client.xrange(turn_stream(turn_id))]
    assert first == ["a"]
    coalescer.flush()
    texts = [json.loads(f[b"event"])["text"] for _i, f in client.xrange(turn_stream(turn_id))]
    assert texts == ["a", "bcd"] and coalescer.messages_sent == 2
    assert "".join(texts) == "abcd"


def test_held_text_is_published_when_its_window_passes_even_if_the_model_pauses(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    turn_id = uuid.uuid4()
    events = TurnEvents(
        session_id=uuid.uuid4(), turn_id=turn_id, client=client, retention=get_settings().event_retention
    )
    coalescer = TextCoalescer(events, 1, window=0.05)
    coalescer.add("first ")
    coalescer.add("held")
    deadline = time.monotonic() + 2
    texts: list[str] = []
    while time.monotonic() < deadline:
        texts = [json.loads(f[b"event"])["text"] for _i, f in client.xrange(turn_stream(turn_id))]
        if len(texts) == 2:
            break
        time.sleep(0.01)
    assert texts == ["first ", "held"]


def _script_calls(client: redis.Redis) -> int:
    """EVAL and EVALSHA commands the server has run, failed ones (NOSCRIPT) included."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha"))


# It empties the server's script cache and reads the server's command counters, which every test
# process shares: run beside others, their scripts land in its counts (a third process made it fail).
@pytest.mark.exclusive
def test_resume_with_numbers_after_the_newest_event_and_publishes_in_one_script(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    session_id, turn_id = uuid.uuid4(), uuid.uuid4()
    earlier = TurnEvents(
        session_id=session_id, turn_id=turn_id, client=client, retention=get_settings().event_retention
    )
    earlier.publish(EventType.QUEUED, 0)
    earlier.publish(EventType.RETRY, 1, error="x")
    client.persist(turn_stream(turn_id))
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(session_channel(session_id))
    time.sleep(0.1)
    client.script_flush()  # the first call finds no cached script and must load it
    calls = _script_calls(client)
    events = TurnEvents.resume_with(
        EventType.STARTED,
        2,
        session_id=session_id,
        turn_id=turn_id,
        client=get_redis(),
        retention=get_settings().event_retention,
    )
    assert _script_calls(client) - calls == 2  # EVALSHA refused (NOSCRIPT), then EVAL
    assert events.seq == 3
    live = None
    deadline = time.monotonic() + 5
    while live is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message:
            live = json.loads(message["data"])
    stored = [json.loads(fields[b"event"]) for _id, fields in client.xrange(turn_stream(turn_id))]
    assert stored[-1] == live
    assert live == {
        "v": 1,
        "type": "started",
        "session_id": str(session_id),
        "turn_id": str(turn_id),
        "attempt": 2,
        "seq": 3,
        "ts": live["ts"],
    }
    assert abs(live["ts"] - time.time()) < 5
    # The same JSON, key order included, as every other event: `seq` before `ts`.
    assert list(live) == ["v", "type", "session_id", "turn_id", "attempt", "seq", "ts"]
    assert client.ttl(turn_stream(turn_id)) > 0  # the script sets the retention clock
    # Later events go on from there, through the usual path; the cached script is used next time.
    assert events.publish(EventType.TEXT, 2, text="hi")["seq"] == 4
    calls = _script_calls(client)
    again = TurnEvents.resume_with(
        EventType.STARTED,
        3,
        session_id=session_id,
        turn_id=turn_id,
        client=get_redis(),
        retention=get_settings().event_retention,
    )
    assert (again.seq, _script_calls(client) - calls) == (5, 1)
    assert again.publish(EventType.FINAL, 3)["seq"] == 6
    pubsub.close()


def test_resume_with_counts_from_zero_where_last_seq_does(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    fresh, garbled = uuid.uuid4(), uuid.uuid4()
    client.xadd(turn_stream(garbled), {"event": "not json"})
    client.xadd(turn_stream(garbled), {"other": "field"})
    for turn_id in (fresh, garbled):
        assert last_seq(client, turn_id) == 0
        events = TurnEvents.resume_with(
            EventType.STARTED,
            1,
            session_id=uuid.uuid4(),
            turn_id=turn_id,
            client=get_redis(),
            retention=get_settings().event_retention,
        )
        assert events.seq == 1
        newest = client.xrevrange(turn_stream(turn_id), count=1)[0][1]
        assert json.loads(newest[b"event"])["seq"] == 1
    client.delete(turn_stream(garbled))


def test_resume_with_falls_back_to_two_steps_and_never_raises(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    turn_id = uuid.uuid4()
    # A key of the wrong type where the stream should be: the script fails, and so do the steps
    # that touch the stream; the turn goes on with its numbering (SPEC: events are best effort).
    client.set(turn_stream(turn_id), "not a stream", ex=60)
    events = TurnEvents.resume_with(
        EventType.STARTED,
        1,
        session_id=uuid.uuid4(),
        turn_id=turn_id,
        client=get_redis(),
        retention=get_settings().event_retention,
    )
    assert events.seq == 1
    assert events.publish(EventType.FINAL, 1)["seq"] == 2
    client.delete(turn_stream(turn_id))


def test_resume_with_during_a_redis_outage_tries_once_and_numbers_from_zero() -> None:
    # A server that accepts and hangs up at once: every attempt to reach it is counted.
    listener = socket.create_server(("127.0.0.1", 0))
    attempts = 0
    stop = threading.Event()

    def hang_up() -> None:
        nonlocal attempts
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            attempts += 1
            conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    client = make_redis(f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
    try:
        # What one call costs against this server: its connection attempts and their retries.
        assert TurnEvents(
            session_id=uuid.uuid4(), turn_id=uuid.uuid4(), client=client, retention=get_settings().event_retention
        ).publish(EventType.FINAL, 1)
        one_call = attempts
        assert one_call >= 1
        events = TurnEvents.resume_with(
            EventType.STARTED,
            1,
            session_id=uuid.uuid4(),
            turn_id=uuid.uuid4(),
            client=client,
            retention=get_settings().event_retention,
        )
        # The script's call only, not the two steps after it as well.
        assert attempts - one_call == one_call
        assert events.seq == 1
        # Like `send` in an outage: the next chunks are dropped for a second without trying...
        assert events.publish(EventType.TEXT, 1, text="x")["seq"] == 2
        assert attempts == 2 * one_call
        # ...and a terminal event always tries.
        assert events.publish(EventType.FINAL, 1)["seq"] == 3
        assert attempts == 3 * one_call
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_turn_has_one_terminal_event_however_often_it_is_published(chatq_env: dict[str, str]) -> None:
    client = redis.Redis.from_url(chatq_env["REDIS_URL"])
    session_id, turn_id = uuid.uuid4(), uuid.uuid4()
    events = TurnEvents(session_id=session_id, turn_id=turn_id, client=client, retention=900)
    events.publish(EventType.STARTED, 1)
    # `started` puts the turn in the unended set: the sweep repairs it if no terminal event comes.
    assert client.zscore(UNENDED, str(turn_id)) is not None
    client.script_flush()  # the terminal script is loaded on the way, the text sent once
    events.send([events.build(EventType.TEXT, 1, text="hi"), events.build(EventType.ERROR, 1, error="no")])
    events.publish(EventType.FINAL, 1, messages=[], usage={})  # a second publisher, or a retried write
    TurnEvents.resume(
        session_id=session_id, turn_id=turn_id, client=client, retention=get_settings().event_retention
    ).publish(EventType.CANCELLED, 1)
    stored = [json.loads(fields[b"event"]) for _id, fields in client.xrange(turn_stream(turn_id))]
    assert [(e["type"], e["seq"]) for e in stored] == [("started", 1), ("text", 2), ("error", 3)]
    assert client.zscore(UNENDED, str(turn_id)) is None
    assert 600 <= client.ttl(ended_marker(turn_id)) <= 900
    assert 600 <= client.ttl(turn_stream(turn_id)) <= 900
