"""chatq/shortcuts/redis_resp.py against the real Redis, taken and not (redis-py's pipeline): the
same replies and errors either way, and the shortcut's own packing, reply reading and reconnects."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.connection import Connection

from chatq.shortcuts import redis_resp
from chatq.shortcuts.redis_resp import pack, roundtrip
from worker.events import make_redis

pytestmark = pytest.mark.usefixtures("chatq_env")


@pytest.fixture(params=["shortcut", "public API"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs on both paths: the module's switch selects redis-py's pipeline."""
    monkeypatch.setattr(redis_resp, "ENABLED", request.param == "shortcut")
    return str(request.param)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = make_redis(redis_url)
    yield client
    client.close()


def _key() -> str:
    return f"test:resp:{uuid.uuid4().hex}"


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


def test_the_shortcut_is_taken_on_the_installed_redis_py() -> None:
    assert redis_resp.GATE.usable()


def test_replies_come_back_in_order(path: str, client: redis.Redis) -> None:
    key = _key()
    replies = roundtrip(
        client,
        [
            ("PUBLISH", key, "nobody listens"),
            ("XADD", key + ":s", "*", "f", "1"),
            ("EXPIRE", key + ":s", 60),
            ("EVAL", "return {ARGV[1], tonumber(ARGV[2]) + 1}", 0, "é", 41),
        ],
    )
    assert replies[0] == 0
    assert isinstance(replies[1], bytes) and b"-" in replies[1]
    assert replies[2] == 1
    assert replies[3] == ["é".encode(), 42]
    assert client.xlen(key + ":s") == 1
    client.delete(key + ":s")


def test_a_refused_command_raises_and_leaves_no_unread_reply_behind(path: str, client: redis.Redis) -> None:
    key = _key()
    client.set(key, "a string")
    with pytest.raises(redis.ResponseError):
        roundtrip(client, [("XADD", key, "*", "f", "1"), ("SET", key + ":2", "x")])
    # The next round trip reads its own replies, not the leftover of the refused batch.
    assert roundtrip(client, [("GET", key)]) == [b"a string"]
    client.delete(key, key + ":2")


def test_an_unknown_script_raises_noscripterror(path: str, client: redis.Redis) -> None:
    # worker.events relies on it to fall back from EVALSHA to EVAL.
    with pytest.raises(redis.exceptions.NoScriptError):
        roundtrip(client, [("EVALSHA", "0" * 40, 0)])
    assert roundtrip(client, [("PING",)]) in ([True], [b"PONG"])


def test_a_connection_the_server_closed_is_replaced(path: str, client: redis.Redis, redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    (client_id,) = roundtrip(client, [("CLIENT", "ID")])
    assert admin.client_kill_filter(_id=str(client_id)) == 1
    assert roundtrip(client, [("PING",)]) in ([True], [b"PONG"])
    admin.close()


def test_round_trips_keep_their_connection_and_a_forked_child_makes_its_own(client: redis.Redis) -> None:
    (first,) = roundtrip(client, [("CLIENT", "ID")])
    pool = client.connection_pool
    taken = []
    get_connection = pool.get_connection
    pool.get_connection = lambda: taken.append(1) or get_connection()  # type: ignore[method-assign]
    try:
        assert [roundtrip(client, [("CLIENT", "ID")]) for _ in range(3)] == [[first]] * 3
    finally:
        del pool.get_connection
    assert taken == [], "each round trip took a connection from the pool"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its round trip must not share the parent's socket
        try:
            (child,) = roundtrip(client, [("CLIENT", "ID")])
            os.write(write, str(child).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child_id = int(os.read(read, 64) or b"0")
    os.close(read)
    assert child_id not in (0, first)
    assert roundtrip(client, [("CLIENT", "ID")]) == [first]
