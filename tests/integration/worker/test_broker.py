"""worker/runtime/intake/broker.py: chatq's Redis transport against the real Redis, through kombu and Celery."""

from __future__ import annotations

import pytest
from kombu import Connection

from worker.runtime.intake.broker import Channel, Transport

pytestmark = pytest.mark.usefixtures("chatq_env")


def test_the_celery_app_publishes_through_chatq_transport() -> None:
    from worker.app import app

    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
        assert isinstance(connection.default_channel, Channel)


def test_one_client_serves_every_publish_and_is_rebuilt_after_the_pools_are_dropped(redis_url: str) -> None:
    with Connection(redis_url, transport=Transport) as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        given = object()
        with channel.conn_or_acquire(given) as passed:
            assert passed is given
        channel._disconnect_pools()
        with channel.conn_or_acquire() as rebuilt:
            assert rebuilt is not first
            assert rebuilt.ping()


def test_each_queue_has_its_own_binding_and_an_earlier_releases_shared_one_is_dropped(redis_url: str) -> None:
    import redis

    from worker.runtime.recovery.sweeper import declare_queues

    client = redis.Redis.from_url(redis_url)
    stray = "chatq\x06\x16\x06\x16chatq.batch"  # both queues on exchange chatq, as before
    client.sadd("_kombu.binding.chatq", stray)
    client.sadd("_kombu.binding_permanent.chatq", stray)
    declare_queues(client)
    assert client.smembers("_kombu.binding.chatq") == {b"chatq\x06\x16\x06\x16chatq"}
    assert client.smembers("_kombu.binding_permanent.chatq") == {b"chatq\x06\x16\x06\x16chatq"}
    assert client.smembers("_kombu.binding.chatq.batch") == {b"chatq.batch\x06\x16\x06\x16chatq.batch"}
    with Connection(redis_url, transport=Transport) as connection:
        channel = connection.default_channel
        assert set(channel._lookup("chatq", "chatq")) == {"chatq"}
        assert set(channel._lookup("chatq.batch", "chatq.batch")) == {"chatq.batch"}
    client.close()


def test_the_item_limit_is_the_transport_option_the_celery_config_derives_from_the_settings(redis_url: str) -> None:
    import redis

    from chatq.settings import get_settings
    from worker.app import app
    from worker.runtime.intake.deadletter import DEAD_LETTER_KEY
    from worker.runtime.intake.intake import max_item_bytes

    with app.connection_for_read() as connection:
        assert connection.default_channel.chatq_item_limit == max_item_bytes(get_settings())
    client = redis.Redis.from_url(redis_url)
    client.delete(DEAD_LETTER_KEY)
    item = b'{"body": "' + b"x" * 2000 + b'"}'
    try:
        with Connection(redis_url, transport=Transport, transport_options={"chatq_item_limit": 1000}) as connection:
            channel = connection.default_channel
            assert channel._admit("chatq", item) is None  # over this channel's limit: set aside
        [aside] = client.lrange(DEAD_LETTER_KEY, 0, -1)
        assert b"over the limit of 1000" in aside
    finally:
        client.delete(DEAD_LETTER_KEY)
        client.close()
