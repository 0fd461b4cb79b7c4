"""worker/resp.py against the real Redis: packing, replies, refused commands, lost connections."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.connection import Connection

from worker.events import make_redis
from worker.resp import pack, roundtrip


@pytest.mark.parametrize(
    "args",
    [
        ("PING",),
        ("SET", "k", "v"),
        ("PUBLISH", "chan", '{"text":"héllo\\r\\n"}'),
        ("EXPIRE", "k", 3600),
        (b"\x00\xff",),
    ],
)
def test_packing_matches_redis_py(args: tuple[str | bytes | int, ...]) -> None:
    assert pack(*args) == b"".join(Connection().pack_command(*args))


def test_replies_come_back_in_order(chatq_env: dict[str, str]) -> None:
    client = make_redis(chatq_env["REDIS_URL"])
    key = f"test:resp:{uuid.uuid4().hex}"
    replies = roundtrip(client, [pack("SET", key, "v"), pack("XADD", key + ":s", "*", "f", "1"), pack("GET", key)])
    assert replies[0] in (True, b"OK") and replies[2] == b"v"
    assert client.xlen(key + ":s") == 1
    client.delete(key, key + ":s")
    client.close()


def test_a_refused_command_raises_and_leaves_no_unread_reply_behind(chatq_env: dict[str, str]) -> None:
    client = make_redis(chatq_env["REDIS_URL"])
    key = f"test:resp:{uuid.uuid4().hex}"
    client.set(key, "a string")
    with pytest.raises(redis.ResponseError):
        roundtrip(client, [pack("XADD", key, "*", "f", "1"), pack("SET", key + ":2", "x")])
    # The next round trip reads its own replies, not the leftover of the refused batch.
    assert roundtrip(client, [pack("GET", key)]) == [b"a string"]
    client.delete(key, key + ":2")
    client.close()


def test_a_connection_the_server_closed_is_replaced(chatq_env: dict[str, str]) -> None:
    client = make_redis(chatq_env["REDIS_URL"])
    admin = redis.Redis.from_url(chatq_env["REDIS_URL"])
    (client_id,) = roundtrip(client, [pack("CLIENT", "ID")])
    assert admin.client_kill_filter(_id=str(client_id)) == 1
    assert roundtrip(client, [pack("PING")]) in ([True], [b"PONG"])
    admin.close()
    client.close()
