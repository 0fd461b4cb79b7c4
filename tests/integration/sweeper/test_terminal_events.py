"""Exactly one terminal event per ended turn, whatever dies when (worker/runtime/recovery/terminal_repair.py).

A turn left as `kill -9` leaves it between committing its end and publishing its terminal event
is made here with the store's own transitions: claimed, `started` and some text published, then
its end committed and nothing more. No worker runs, so the sweep and the publishers are the only
ones writing events.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from chatq.settings import get_settings
from handlers.messages import AgentMessage
from models.db import get_engine, session_scope
from models.tables import TurnStatus
from tests.support.inprocess import build_runtime
from tests.support.turns import replay_events
from worker.event_scripts import UNENDED, add_unended
from worker.events import TERMINAL_TYPES, EventType, TurnEvents, get_redis, session_channel
from worker.payload import GUARDED_QUEUES
from worker.producer import cancel_turn, create_session, submit_turn
from worker.runtime.recovery import terminal_repair
from worker.runtime.recovery.sweeper import sweep_once
from worker.store import claims

USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


@pytest.fixture
def client(chatq_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    """Redis, with no settling time for the repair (the turns here ended "long ago"); the task
    messages the producer sent are dropped after the test, as no worker consumes them."""
    monkeypatch.setattr(terminal_repair, "SETTLE", 0.0)
    connection = redis.Redis.from_url(chatq_env["REDIS_URL"])
    yield connection
    connection.delete(*GUARDED_QUEUES)
    connection.close()


class Channel:
    """The session's pub/sub channel, subscribed before anything is repaired."""

    def __init__(self, client: redis.Redis, session_id: uuid.UUID) -> None:
        self.pubsub = client.pubsub()  # type: ignore[no-untyped-call]
        self.pubsub.subscribe(session_channel(session_id))
        deadline = time.monotonic() + 10
        while (confirmed := self.pubsub.get_message(timeout=0.5)) is None or confirmed["type"] != "subscribe":
            assert time.monotonic() < deadline, "no subscription confirmed"

    def received(self, quiet: float = 0.5) -> list[dict[str, Any]]:
        """What arrived, until `quiet` seconds pass without a message."""
        events = []
        while (message := self.pubsub.get_message(timeout=quiet)) is not None:
            if message["type"] == "message":
                events.append(json.loads(message["data"]))
        return events


def started(session_id: uuid.UUID | None = None, text: str = "hel") -> tuple[claims.Claim, TurnEvents]:
    """A submitted turn, claimed by a worker that published `started` and some text."""
    session_id = session_id or create_session(framework="none", model="echo")
    turn = submit_turn(session_id, "hello")
    claimed = claims.claim_turn(turn.turn_id, worker="doomed@host", engine=get_engine(), settings=get_settings())
    assert claimed.claim is not None
    claim = claimed.claim
    events = TurnEvents.resume_with(
        EventType.STARTED,
        claim.attempt,
        session_id=session_id,
        turn_id=claim.turn_id,
        client=get_redis(),
        retention=get_settings().event_retention,
    )
    events.publish(EventType.TEXT, claim.attempt, text=text)
    return claim, events


def succeeded_without_final(session_id: uuid.UUID | None = None) -> tuple[claims.Claim, TurnEvents]:
    """Its reply committed, then its worker killed before it published `final`."""
    claim, events = started(session_id, text="hello")
    assert claims.complete_turn(
        claim, [AgentMessage(role="assistant", content="hello")], USAGE, engine=get_engine()
    ).stored
    return claim, events


def terminal(redis_url: str, turn_id: uuid.UUID) -> list[dict[str, Any]]:
    return [event for event in replay_events(redis_url, turn_id) if event["type"] in TERMINAL_TYPES]


def test_a_turn_killed_after_storing_its_reply_gets_one_final_event(client: redis.Redis, redis_url: str) -> None:
    claim, _ = succeeded_without_final()
    channel = Channel(client, claim.session.id)
    assert terminal(redis_url, claim.turn_id) == []

    report = sweep_once(build_runtime())

    assert report.repaired >= 1
    events = replay_events(redis_url, claim.turn_id)
    assert [e["type"] for e in events] == ["queued", "started", "text", "final"]
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    final = events[-1]
    assert final["repaired"] is True and final["attempt"] == 1 and final["usage"] == USAGE
    assert final["messages"] == [
        {"role": "assistant", "content": "hello", "tool_calls": None, "tool_call_id": None, "citations": None}
    ]
    # The event format is the contract's: its fields in its order, `repaired` the only extra.
    assert list(final)[:7] == ["v", "type", "session_id", "turn_id", "attempt", "seq", "ts"]
    live = [e for e in channel.received() if e["turn_id"] == str(claim.turn_id)]
    assert live == [final]

    # Once out, never again: the turn left the unended set, and its marker stays.
    sweep_once(build_runtime())
    assert (
        terminal_repair.publish_missing_terminal_events(
            engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
        )
        == []
    )
    assert replay_events(redis_url, claim.turn_id) == events
    assert [e for e in channel.received() if e["turn_id"] == str(claim.turn_id)] == []
    assert client.zscore(UNENDED, str(claim.turn_id)) is None
    channel.pubsub.close()


def test_failed_and_cancelled_turns_get_theirs(client: redis.Redis, redis_url: str) -> None:
    failing, _ = started()
    assert claims.finish_turn(failing, TurnStatus.FAILED, "the model said no", engine=get_engine()).stored
    # A queued turn cancelled as `cancel_turn` does it (noted as ending, then the cancel
    # committed), its producer killed before it announced the cancel.
    session_id = create_session(framework="none", model="echo")
    queued = submit_turn(session_id, "never runs")
    add_unended(client, [queued.turn_id], now=time.time())
    with session_scope() as db:
        assert claims.request_cancel(db, [queued.turn_id]) == {queued.turn_id: TurnStatus.CANCELLED}

    repaired = terminal_repair.publish_missing_terminal_events(
        engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
    )

    assert {failing.turn_id, queued.turn_id} <= set(repaired)
    [error] = terminal(redis_url, failing.turn_id)
    assert (error["type"], error["error"], error["attempt"], error["repaired"]) == (
        "error",
        "the model said no",
        1,
        True,
    )
    [cancelled] = terminal(redis_url, queued.turn_id)
    assert (cancelled["type"], cancelled["attempt"], cancelled["seq"]) == ("cancelled", 0, 2)


def test_a_live_publisher_racing_the_repair_publishes_one_terminal_event(client: redis.Redis, redis_url: str) -> None:
    session_id = create_session(framework="none", model="echo")
    channel = Channel(client, session_id)
    turns = [succeeded_without_final(session_id) for _ in range(16)]
    gate = threading.Barrier(len(turns) + 1)

    def live(claim: claims.Claim, events: TurnEvents) -> None:
        gate.wait()
        events.publish(EventType.FINAL, claim.attempt, messages=[], usage=USAGE)

    threads = [threading.Thread(target=live, args=turn) for turn in turns]
    for thread in threads:
        thread.start()
    gate.wait()
    terminal_repair.publish_missing_terminal_events(
        engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
    )
    for thread in threads:
        thread.join()

    for claim, events in turns:
        assert len(terminal(redis_url, claim.turn_id)) == 1
        # A publisher that comes back later still adds nothing.
        events.publish(EventType.FINAL, claim.attempt, messages=[], usage=USAGE)
        assert (
            terminal_repair.publish_missing_terminal_events(
                engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
            )
            == []
        )
        assert len(terminal(redis_url, claim.turn_id)) == 1
    received = [e for e in channel.received() if e["type"] in TERMINAL_TYPES]
    assert sorted(e["turn_id"] for e in received) == sorted(str(claim.turn_id) for claim, _ in turns)
    channel.pubsub.close()


def test_unfinished_turns_wait_and_deleted_ones_leave_the_set(client: redis.Redis, redis_url: str) -> None:
    running, _ = started()
    vanished = uuid.uuid4()
    add_unended(client, [vanished], now=time.time() - 60)
    before = client.zscore(UNENDED, str(running.turn_id))
    assert before is not None

    assert (
        terminal_repair.publish_missing_terminal_events(
            engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
        )
        == []
    )

    assert terminal(redis_url, running.turn_id) == []
    # Still waiting for its end, now at the back of the set; a turn that no longer exists is gone.
    after = client.zscore(UNENDED, str(running.turn_id))
    assert after is not None and after >= before
    assert client.zscore(UNENDED, str(vanished)) is None
    # Its worker ends it and publishes: the one terminal event, live (not repaired).
    assert claims.complete_turn(
        running, [AgentMessage(role="assistant", content="hel")], USAGE, engine=get_engine()
    ).stored
    TurnEvents.resume(
        session_id=running.session.id,
        turn_id=running.turn_id,
        client=get_redis(),
        retention=get_settings().event_retention,
    ).publish(EventType.FINAL, running.attempt, messages=[], usage=USAGE)
    assert client.zscore(UNENDED, str(running.turn_id)) is None
    [final] = terminal(redis_url, running.turn_id)
    assert "repaired" not in final


def test_a_recently_ended_turn_is_left_to_its_own_publisher(client: redis.Redis, redis_url: str) -> None:
    claim, _ = succeeded_without_final()
    assert claim.turn_id not in terminal_repair.publish_missing_terminal_events(
        settle=30, engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
    )
    assert terminal(redis_url, claim.turn_id) == []
    assert claim.turn_id in terminal_repair.publish_missing_terminal_events(
        settle=0, engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
    )


def test_a_cancel_noted_as_ending_leaves_the_set_with_its_one_event(client: redis.Redis, redis_url: str) -> None:
    session_id = create_session(framework="none", model="echo")
    queued = submit_turn(session_id, "cancel me")
    running, _ = started()
    assert cancel_turn(queued.turn_id).status is TurnStatus.CANCELLED
    assert cancel_turn(running.turn_id).status is TurnStatus.RUNNING  # its worker ends it

    assert queued.turn_id not in terminal_repair.publish_missing_terminal_events(
        engine=get_engine(), client=get_redis(), retention=get_settings().event_retention
    )

    [cancelled] = terminal(redis_url, queued.turn_id)
    assert "repaired" not in cancelled
    assert client.zscore(UNENDED, str(queued.turn_id)) is None
    assert client.zscore(UNENDED, str(running.turn_id)) is not None
