"""Stream events against the real Redis: numbering, replay stream, retention, hiccups."""

from __future__ import annotations

import json
import time
import uuid

import redis

from worker.events import EventType, TextCoalescer, TurnEvents, last_seq, make_redis, session_channel, turn_stream


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
    resumed = TurnEvents.resume(session_id=session_id, turn_id=turn_id)
    assert resumed.publish(EventType.RETRY, 2)["seq"] == 4
    pubsub.close()


def test_a_redis_outage_never_raises_from_publish(chatq_env: dict[str, str]) -> None:
    dead = make_redis("redis://127.0.0.1:1/0")
    events = TurnEvents(session_id=uuid.uuid4(), turn_id=uuid.uuid4(), client=dead)
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
    events = TurnEvents(session_id=uuid.uuid4(), turn_id=turn_id, client=client)
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
    events = TurnEvents(session_id=uuid.uuid4(), turn_id=turn_id, client=client)
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
