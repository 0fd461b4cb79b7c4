"""Untrusted items on chatq's Redis lists, fed to a live worker: refused items are set aside, the
worker stays up and serves good turns, nothing stays queued, and retries go back to their queue."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.db import session_scope
from models.tables import Turn
from tests.integration.worker.conftest import STUB_MODEL
from tests.support.envelopes import GOOD_EMBED, encoded, envelope, turn_kwargs
from tests.support.turns import wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.events import session_channel
from worker.producer import create_session, submit_turn
from worker.runtime.intake.deadletter import DEAD_LETTER_KEY

pytestmark = pytest.mark.slow

QUEUES = ("chatq", "chatq.batch")


@pytest.fixture
def broker(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.delete(DEAD_LETTER_KEY)
    yield client
    client.delete(DEAD_LETTER_KEY)
    client.close()


def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _unacked(client: redis.Redis) -> set[bytes]:
    """Delivery tags of messages taken but not acknowledged (kombu's `unacked` hash)."""
    return set(client.hkeys("unacked"))


def _drained(client: redis.Redis, before: set[bytes] | None = None) -> bool:
    """Nothing waiting in chatq's queues and nothing taken but unacknowledged, beyond what an
    earlier test's killed worker may have left (`before`)."""
    return all(client.llen(q) == 0 for q in QUEUES) and _unacked(client) <= (before or set())


def _good_turns_run(worker: WorkerProcess, count: int = 5) -> None:
    session_id = create_session(framework="none", model=STUB_MODEL)
    turns = [submit_turn(session_id, f"good turn {n}").turn_id for n in range(count)]
    rows = wait_for_turns(turns, timeout=60)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    assert worker.alive


def _malformed(secret: str) -> list[tuple[bytes, str | None]]:
    """One item of each kind, and whether (turn_id) its ids can be trusted."""
    items: list[tuple[bytes, str | None]] = []

    def add(item: dict[str, Any] | bytes, trusted: str | None = None) -> None:
        items.append((item if isinstance(item, bytes) else encoded(item), trusted))

    turn_id, session_id = str(uuid.uuid4()), str(uuid.uuid4())
    # The reported crash-loop: two elements, no embed; its ids are trustworthy.
    add(
        envelope(body=[[], turn_kwargs(turn_id, session_id, secret)], task_id=turn_id),
        trusted=f"{turn_id} {session_id}",
    )
    add(envelope(body={"task": "chatq.run_turn", "kwargs": {"content": secret}}))
    add(envelope(body=[[], {"content": secret}, GOOD_EMBED, "extra"]))
    add({**envelope({"content": secret}), "headers": ["not", "an", "object"]})
    add({**envelope({"content": secret}), "properties": "nope"})
    bad_tag = envelope({"content": secret})
    bad_tag["properties"]["delivery_tag"] = 12
    add(bad_tag)
    add({**envelope({"content": secret}), "body": "%%% not base64"})
    add({**envelope({"content": secret}), "body": base64.b64encode(b"\xff" + secret.encode()).decode()})
    add(f"\x00 not json {secret}".encode())
    add(b"\xff\xfe" + secret.encode())
    add(envelope({"content": secret}, headers={"compression": "application/x-gzip"}))
    add(envelope({"content": secret}, headers={"eta": 12345, "retries": "many"}))
    add(envelope(body=[[], [secret], GOOD_EMBED]))
    # The wedge: embeds and chains Celery cannot use, 32 of them (a default worker's pool and more).
    for n in range(32):
        embed = [{"chain": "x"}, {"callbacks": [{"bogus": n}]}, {"chord": {"task": 1}}, []][n % 4]
        add(envelope(body=[[], {"session_id": str(uuid.uuid4()), "content": secret}, embed]))
    return items


def test_malformed_items_are_set_aside_and_the_worker_keeps_serving(worker: WorkerProcess, broker: redis.Redis) -> None:
    before = _unacked(broker)
    secret = f"private-{uuid.uuid4().hex}"
    items = _malformed(secret)
    trusted = [t for _, t in items if t]
    pubsub = broker.pubsub()
    for ids in trusted:
        pubsub.subscribe(session_channel(ids.split()[1]))
    for item, _ in items:
        broker.lpush("chatq", item)
    _good_turns_run(worker)
    _until(lambda: _drained(broker, before), "the queues to drain")
    _until(lambda: broker.llen(DEAD_LETTER_KEY) == len(items), "every refused item in the dead-letter list")

    entries = [json.loads(raw) for raw in broker.lrange(DEAD_LETTER_KEY, 0, -1)]
    assert {e["queue"] for e in entries} == {"chatq"}
    assert all(e["reason"] and "\n" not in e["reason"] and secret not in e["reason"] for e in entries)
    assert broker.ttl(DEAD_LETTER_KEY) > 0
    log = worker.log()
    assert log.count("set aside a malformed message from queue chatq") >= len(items)
    assert secret not in log, "a refused item's content reached the log"
    assert "Unrecoverable error" not in log

    # The refused turn whose ids could be trusted gets its error event; nothing of it is stored.
    turn_id = trusted[0].split()[0]
    deadline = time.monotonic() + 20
    event: dict[str, Any] | None = None
    while event is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=1.0)
        if message and message["type"] == "message":
            data = json.loads(message["data"])
            event = data if data.get("turn_id") == turn_id else None
    pubsub.close()
    assert event is not None and event["type"] == "error", event
    assert "Celery's [args, kwargs, embed]" in event["error"]
    with session_scope() as db:
        assert db.get(Turn, uuid.UUID(turn_id)) is None


def test_a_fresh_worker_started_on_a_poisoned_queue_stays_up(worker_env: dict[str, str], broker: redis.Redis) -> None:
    before = _unacked(broker)
    # The reported reproduction: with the item queued, every worker started exited with status 1.
    turn_id = str(uuid.uuid4())
    item = envelope(body=[[], turn_kwargs(turn_id, str(uuid.uuid4()), "x")], task_id=turn_id)
    broker.lpush("chatq.batch", encoded(item))
    fresh = WorkerProcess(worker_env, concurrency=2, queues="chatq.batch").start()
    try:
        _until(lambda: broker.llen(DEAD_LETTER_KEY) == 1, "the item set aside")
        assert broker.llen("chatq.batch") == 0 and _unacked(broker) <= before
        assert fresh.alive
        assert json.loads(broker.lindex(DEAD_LETTER_KEY, 0))["queue"] == "chatq.batch"
    finally:
        assert fresh.stop() == 0


@pytest.mark.parametrize("exchange", ["chatq", "celery", "chatq.batch"])
def test_a_foreign_producers_retry_goes_back_to_its_own_queue_once(
    worker: WorkerProcess, broker: redis.Redis, exchange: str
) -> None:
    before = _unacked(broker)
    # Some clients write an exchange name into delivery_info; Celery's retry used to republish
    # by it, reaching both queues ("chatq") or none ("celery").
    turn_id, session_id = str(uuid.uuid4()), str(uuid.uuid4())
    content = f"retry me [fail-once: {uuid.uuid4().hex}]"
    item = envelope(turn_kwargs(turn_id, session_id, content), task_id=turn_id, exchange=exchange, routing_key="chatq")
    broker.lpush("chatq", encoded(item))
    turn = wait_for_turn(uuid.UUID(turn_id), timeout=60)
    assert turn.status.value == "succeeded" and turn.attempts == 2, (turn.status, turn.error)
    _until(lambda: _drained(broker, before), "the queues to drain")
    received = worker.log().count(f"chatq.run_turn[{turn_id}] received")
    assert received == 2, f"the turn was delivered {received} times (once, then its one retry)"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
PATHS = [
    ("body",),
    ("content-type",),
    ("content-encoding",),
    ("headers",),
    ("headers", "task"),
    ("headers", "id"),
    ("headers", "eta"),
    ("headers", "expires"),
    ("headers", "retries"),
    ("headers", "timelimit"),
    ("headers", "compression"),
    ("headers", "argsrepr"),
    ("properties",),
    ("properties", "delivery_tag"),
    ("properties", "body_encoding"),
    ("properties", "priority"),
    ("properties", "delivery_info"),
]


@st.composite
def fuzzed_item(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["field", "body", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    kwargs = {"session_id": str(uuid.uuid4()), "content": "fuzz"}
    if kind == "body":
        body = draw(
            st.one_of(
                JSON,
                st.lists(JSON, max_size=5),
                st.tuples(JSON, st.just(kwargs), JSON).map(list),
                st.tuples(st.just([]), st.just(kwargs), st.dictionaries(st.sampled_from(list(GOOD_EMBED)), JSON)).map(
                    list
                ),
            )
        )
        return encoded(envelope(body=body))
    item = envelope(kwargs)
    path = draw(st.sampled_from(PATHS))
    target = item
    for key in path[:-1]:
        target = target[key]
    if draw(st.booleans()):
        target.pop(path[-1], None)
    else:
        target[path[-1]] = draw(JSON)
    return encoded(item)


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(items=st.lists(fuzzed_item(), min_size=60, max_size=60))
def test_fuzzed_envelopes_never_stop_or_wedge_the_worker(
    worker: WorkerProcess, broker: redis.Redis, items: list[bytes]
) -> None:
    before = _unacked(broker)
    for item in items:
        broker.lpush("chatq", item)
    _until(lambda: _drained(broker, before), "the fuzzed items to be taken and settled", timeout=90)
    _good_turns_run(worker, count=2)
    assert "Unrecoverable error" not in worker.log()
