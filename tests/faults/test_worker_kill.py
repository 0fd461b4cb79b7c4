"""kill -9 of a worker in the middle of a streaming turn: another worker and the sweeper finish it, once.

Here `chatq beat` sweeps and the workers' own sweeps are off (CHATQ_WORKER_SWEEP=off), so beat, the
optional way, stays proven on its own; tests/faults/test_worker_sweeps.py runs the same fault without beat.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from models.tables import Turn
from tests.faults.helpers import (
    LEASE_SECONDS,
    STUB_MODEL,
    SWEEP_INTERVAL,
    Beat,
    Workers,
    wait_finished,
    wait_for_event,
)
from tests.support.turns import replay_events, turn_messages
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

TEXT = "tell me a long story [words: 40] [slow: 0.1]"
TAKEOVER_BOUND = LEASE_SECONDS * 4 + 10
"""Lease + sweep interval + a generous margin for a loaded machine; not a speed requirement."""


@dataclass(frozen=True, kw_only=True)
class KilledTurn:
    """What happened when a worker was killed under a running turn."""

    turn_id: uuid.UUID
    row: Turn
    events: list[dict[str, Any]]
    takeover_seconds: float
    victim_name: str
    survivor_name: str
    survivor_alive: bool


@pytest.fixture(scope="module")
def killed_turn(
    worker_env: dict[str, str], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KilledTurn]:
    """Two workers and beat; the worker running a slow turn is killed -9 once it has streamed a little."""
    pool = Workers({**worker_env, "CHATQ_WORKER_SWEEP": "off"})
    beat = Beat(worker_env, Path(tmp_path_factory.mktemp("beat-kill")))
    try:
        first, second = pool.start(2)
        beat.start()
        session_id = create_session(framework="langgraph", model=STUB_MODEL)
        turn = submit_turn(session_id, TEXT)
        wait_for_event(redis_url, turn.turn_id, "text", count=5, timeout=30)
        victim = pool.owner_of(turn.turn_id)
        survivor = second if victim is first else first
        killed_at = time.time()
        victim.kill()
        restarted = wait_for_event(redis_url, turn.turn_id, "started", count=2, timeout=TAKEOVER_BOUND + 20)
        takeover = float(restarted["ts"]) - killed_at
        print(f"\ntakeover after kill -9: {takeover:.2f}s (lease {LEASE_SECONDS:g}s, sweep every {SWEEP_INTERVAL:g}s)")
        row = wait_finished([turn.turn_id], timeout=60)[turn.turn_id]
        yield KilledTurn(
            turn_id=turn.turn_id,
            row=row,
            events=replay_events(redis_url, turn.turn_id),
            takeover_seconds=takeover,
            victim_name=victim.name,
            survivor_name=survivor.name,
            survivor_alive=survivor.alive,
        )
    except BaseException:
        print(pool.logs(), f"\n--- beat ---\n{beat.log()[-3000:]}")
        raise
    finally:
        pool.kill_all()
        beat.kill()


@pytest.mark.timeout(120)
def test_a_killed_workers_turn_is_finished_by_another_worker_once(killed_turn: KilledTurn) -> None:
    row = killed_turn.row
    assert row.status.value == "succeeded", row.error
    assert row.worker is not None and row.worker.startswith(f"{killed_turn.survivor_name}@")
    assert killed_turn.survivor_alive

    stored = turn_messages(killed_turn.turn_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].content.split() == [f"w{i}" for i in range(1, 41)]

    types = [event["type"] for event in killed_turn.events]
    assert types.count("final") == 1 and types[-1] == "final"
    started = [event["attempt"] for event in killed_turn.events if event["type"] == "started"]
    assert started == list(range(1, row.attempts + 1)), "one started event per attempt"
    assert row.attempts == 2
    assert [event["seq"] for event in killed_turn.events] == list(range(1, len(killed_turn.events) + 1))
    assert killed_turn.events[-1]["messages"][-1]["content"] == stored[1].content

    print(f"takeover time: {killed_turn.takeover_seconds:.2f}s (bound {TAKEOVER_BOUND:g}s)")
    assert 0 < killed_turn.takeover_seconds < TAKEOVER_BOUND


@pytest.mark.timeout(60)
def test_a_consumer_following_the_event_contract_sees_the_taken_over_reply_once(killed_turn: KilledTurn) -> None:
    """SPEC: "A `retry` event tells consumers to drop the partial text of the failed attempt".

    A consumer that does exactly that (keeps text, drops it on `retry`) must end with the stored
    reply. The killed attempt streamed part of the reply before it died; unless something tells the
    consumer to drop it, the consumer shows that part twice.
    """
    shown: list[str] = []
    for event in killed_turn.events:
        if event["type"] == "retry":
            shown.clear()
        elif event["type"] == "text":
            shown.append(event["text"])
    final = killed_turn.events[-1]
    assert final["type"] == "final"
    reply = final["messages"][-1]["content"]
    types = [event["type"] for event in killed_turn.events]
    assert "".join(shown) == reply, (
        "after a takeover the consumer shows the dead attempt's partial text and then the whole reply: "
        f"no `retry` event between the attempts (event types: {types[:3]} ... started at "
        f"{[i for i, t in enumerate(types) if t == 'started']})"
    )
