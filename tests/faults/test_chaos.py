"""Chaos: a batch of turns while workers are killed (-9) and restarted at random; nothing lost or duplicated."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest

from tests.faults.helpers import (
    STUB_MODEL,
    Beat,
    Worker,
    Workers,
    load_turns,
    messages_by_turn,
    session_transcript,
    wait_finished,
)
from tests.support.turns import FINISHED
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

SEED = 4242
# 12 sessions: each worker slot still has turns of several sessions running at every kill.
SESSIONS, TURNS_PER_SESSION = 12, 10
WORKER_SLOTS, CONCURRENCY = 3, 8
CHAOS_SECONDS = 30.0
KILL_EVERY = (2.0, 4.0)
TEXT = "[words: 5] [slow: 0.2]"
"""About a second per turn, so every kill lands on running turns."""
CHAOS_ENV = {
    # Under random kills a turn can be on the killed worker several times in a row; that is not
    # poison, and this test is about losing and duplicating, so the poison limit is set out of reach.
    "CHATQ_MAX_DELIVERIES": "50",
}


class Chaos:
    """Kills a random worker every few seconds and starts a replacement, in a background thread."""

    def __init__(self, workers: Workers, slots: list[Worker], rng: random.Random) -> None:
        self.workers = workers
        self.slots = slots
        self.rng = rng
        self.faults = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(*KILL_EVERY)):
                slot = self.rng.randrange(len(self.slots))
                self.slots[slot].kill()
                self.faults += 1
                self.slots[slot] = self.workers.launch(
                    concurrency=CONCURRENCY, env=CHAOS_ENV, name=f"chaos{self.faults}-{slot}"
                )
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Chaos:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.mark.timeout(200)
def test_random_worker_kills_lose_and_duplicate_no_turn(workers: Workers, beat: Beat) -> None:
    rng = random.Random(SEED)
    slots: list[Worker] = workers.start(WORKER_SLOTS, concurrency=CONCURRENCY, env=CHAOS_ENV)
    sessions = [create_session(framework="langgraph", model=STUB_MODEL) for _ in range(SESSIONS)]
    texts: dict[uuid.UUID, list[str]] = {session_id: [] for session_id in sessions}
    turn_ids: list[uuid.UUID] = []
    began = time.monotonic()
    with Chaos(workers, slots, rng) as chaos:
        for index in range(TURNS_PER_SESSION):
            for number, session_id in enumerate(sessions):
                text = f"session {number} turn {index} {TEXT}"
                turn_ids.append(submit_turn(session_id, text).turn_id)
                texts[session_id].append(text)
        submitted = time.monotonic() - began
        while time.monotonic() - began < CHAOS_SECONDS:
            if all(row.status.value in FINISHED for row in load_turns(turn_ids).values()):
                break
            time.sleep(0.5)
    assert chaos.error is None, chaos.error
    chaos_seconds = time.monotonic() - began

    rows = wait_finished(turn_ids, timeout=120)
    wall = time.monotonic() - began
    by_turn = messages_by_turn(sessions)
    replies = {turn_id: sum(1 for m in by_turn.get(turn_id, []) if m.role == "assistant") for turn_id in turn_ids}
    lost = [turn_id for turn_id in turn_ids if rows[turn_id].status.value != "succeeded" or replies[turn_id] == 0]
    duplicated = [turn_id for turn_id in turn_ids if replies[turn_id] > 1]
    taken_over = sum(1 for row in rows.values() if row.deliveries > 1)
    # Longest time a turn waited after it became runnable (its predecessor finished) before a claim.
    waits: list[float] = []
    for session_id in sessions:
        ordered = sorted((row for row in rows.values() if row.session_id == session_id), key=lambda r: r.position)
        for previous, row in zip([None, *ordered], ordered, strict=False):
            ready = row.created_at if previous is None else previous.finished_at
            if ready is not None and row.started_at is not None:
                waits.append((row.started_at - ready).total_seconds())
    print(
        f"\nchaos figures: turns={len(turn_ids)} sessions={SESSIONS} faults={chaos.faults} (kill -9 of 1 of "
        f"{WORKER_SLOTS} workers every {KILL_EVERY[0]:g}-{KILL_EVERY[1]:g}s for {chaos_seconds:.1f}s) "
        f"taken_over={taken_over} lost={len(lost)} duplicated={len(duplicated)} "
        f"max_wait_runnable={max(waits, default=0):.1f}s wall={wall:.1f}s "
        f"(submitting took {submitted:.1f}s) seed={SEED}"
    )

    assert lost == [], {str(t)[:8]: (rows[t].status.value, rows[t].error) for t in lost}
    assert duplicated == []
    assert chaos.faults >= 3, "the batch finished before the chaos could do anything: make the turns slower"
    for session_id in sessions:
        transcript = session_transcript(session_id)
        assert [role for role, _ in transcript] == ["user", "assistant"] * TURNS_PER_SESSION
        assert [content for role, content in transcript if role == "user"] == texts[session_id]
