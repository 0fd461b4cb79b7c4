"""chatq/shortcuts/kombu_channel.py against the real Redis, taken and not (kombu's own client per
command): messages go through the same either way; only the taken path reuses one client."""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis

from chatq.shortcuts import kombu_channel
from chatq.shortcuts.kombu_channel import ClientReusingChannel

pytestmark = pytest.mark.usefixtures("chatq_env")


class _Transport(kombu_redis.Transport):
    """kombu's Redis transport with the shortcut's channel and nothing else of chatq's."""

    Channel = ClientReusingChannel


@pytest.fixture(params=[True, False], ids=["shortcut", "public API"])
def enabled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(kombu_channel, "ENABLED", request.param)
    return bool(request.param)


def test_the_shortcut_is_taken_on_the_installed_kombu() -> None:
    assert kombu_channel.GATE.usable()


def test_commands_without_a_client_share_one_only_on_the_shortcut(enabled: bool, redis_url: str) -> None:
    with Connection(redis_url, transport=_Transport) as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first.ping() and second.ping()
            assert (first is second) is enabled
        given = object()
        with channel.conn_or_acquire(given) as passed:
            assert passed is given


def test_messages_arrive_in_order_either_way(enabled: bool, redis_url: str) -> None:
    queue = Queue(f"chatq.test-shortcut.{uuid.uuid4().hex}")
    with Connection(redis_url, transport=_Transport) as connection:
        producer = connection.Producer(serializer="json")
        for n in range(5):
            producer.publish({"n": n}, routing_key=queue.name, declare=[queue])
        received: list[int] = []
        with connection.SimpleQueue(queue) as simple:
            for _ in range(5):
                message = simple.get(timeout=5)
                received.append(message.payload["n"])
                message.ack()
            simple.queue.delete()
    assert received == [0, 1, 2, 3, 4]


def test_chatqs_guarded_channel_sets_a_refused_item_aside_either_way(enabled: bool, redis_url: str) -> None:
    # worker.runtime.intake.broker's guard sits on this channel and sends its dead-letter write through
    # `conn_or_acquire`, so it must work on both paths.
    import json

    import redis

    from worker.runtime.intake.broker import Channel, Transport
    from worker.runtime.intake.deadletter import DEAD_LETTER_KEY

    client = redis.Redis.from_url(redis_url)
    client.delete(DEAD_LETTER_KEY)
    with Connection(redis_url, transport=Transport) as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel) and isinstance(channel, ClientReusingChannel)
        assert channel._admit("chatq", b"not json at all") is None
    (entry,) = client.lrange(DEAD_LETTER_KEY, 0, -1)
    assert json.loads(entry)["queue"] == "chatq"
    client.delete(DEAD_LETTER_KEY)
    client.close()
