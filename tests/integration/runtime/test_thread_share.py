"""Weighted fair share of the workers' threads between tenants (worker.runtime.policy.threads), against
the test run's real Redis: a fleet of `THREADS` threads takes turn messages off the real `chatq.batch`
list in FIFO order (their sent-markers counted per tenant as `worker.dispatch` does), asks the real
ACQUIRE script of the threads scope for each, runs a granted turn for `TURN` seconds and puts a
refused one back until the limiter's time, as the runner and Celery's countdown would."""

from __future__ import annotations

import heapq
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest
import redis

from tests.support.inprocess import InProcessWorker, build_runtime
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages, wait_for_turns
from worker import tenant_queue
from worker.events import get_redis
from worker.markers import mark_taken, set_markers
from worker.payload import BATCH_QUEUE
from worker.producer import create_session, submit_turn
from worker.runtime.policy import limits, threads
from worker.runtime.policy.limits import Scope
from worker.store.claim_values import Claim, ClaimedSession

THREADS = 8
TURN = 0.1
"""Seconds a granted turn holds its thread: the fleet runs THREADS / TURN = 80 turns a second."""
RATE = THREADS / TURN


@pytest.fixture
def client(chatq_env: dict[str, str]) -> Iterator[redis.Redis]:
    redis_client = get_redis()
    scope = threads.threads_scope(THREADS)
    redis_client.delete(*scope.keys(), *scope.share_keys(), tenant_queue.QUEUED_KEY, BATCH_QUEUE, threads.FLEET_KEY)
    yield redis_client
    redis_client.delete(*scope.keys(), *scope.share_keys(), tenant_queue.QUEUED_KEY, BATCH_QUEUE, threads.FLEET_KEY)


@dataclass
class Fleet:
    """The workers: a FIFO of sent messages, threads that take them, turns put back until their time."""

    client: redis.Redis
    scope: Scope = field(default_factory=lambda: threads.threads_scope(THREADS))
    weights: dict[str, float] = field(default_factory=dict)
    fifo: deque[tuple[str | None, str]] = field(default_factory=deque)
    held: list[tuple[float, int, str | None, str]] = field(default_factory=list)
    running: list[tuple[float, str]] = field(default_factory=list)
    grants: list[tuple[float, str | None]] = field(default_factory=list)
    yields: Counter[str] = field(default_factory=Counter)
    _serial: int = 0

    def send(self, tenant: str | None, count: int) -> None:
        """`count` turns of `tenant` (None: a session without one) sent to `chatq.batch`, markers first."""
        members = [f"{tenant}-{uuid.uuid4().hex[:12]}" for _ in range(count)]
        set_markers(self.client, members, {m: tenant for m in members} if tenant else None)
        self.client.lpush(BATCH_QUEUE, *([b"message"] * count))
        self.fifo.extend((tenant, member) for member in members)

    def run_until(self, end: float) -> None:
        while (now := time.monotonic()) < end:
            while self.running and self.running[0][0] <= now:
                _, member = heapq.heappop(self.running)
                limits.release(self.client, self.scope, member, succeeded=True, seconds=TURN, estimate=1, tokens=0)
            while len(self.running) < THREADS and (turn := self._next(now)) is not None:
                self._ask(*turn, time.monotonic())  # a yield frees its thread at once: many asks per round
            soon = [at for at, *_ in self.held[:1]] + [at for at, _ in self.running[:1]]
            time.sleep(max(min([*soon, now + 0.002]) - time.monotonic(), 0.0005))

    def _next(self, now: float) -> tuple[str | None, str] | None:
        # A turn put back runs when due (Celery holds it with its countdown); else the list's head.
        if self.held and self.held[0][0] <= now:
            _, _, tenant, member = heapq.heappop(self.held)
            return tenant, member
        if self.fifo:
            tenant, member = self.fifo.popleft()
            self.client.rpop(BATCH_QUEUE)
            mark_taken(self.client, member, queue=BATCH_QUEUE)
            return tenant, member
        return None

    def _ask(self, tenant: str | None, member: str, now: float) -> None:
        if tenant is None:  # no tenant: the scope is skipped, the turn just runs
            self.grants.append((now, None))
            heapq.heappush(self.running, (now + TURN, member))
            return
        grant = limits.acquire(
            self.client,
            self.scope,
            member,
            interactive=False,
            hint_tokens=1,
            lease_seconds=30,
            tenant=tenant,
            weight=self.weights.get(tenant, 1.0),
            weights=",".join(f"{name}={weight}" for name, weight in self.weights.items()),
        )
        if grant.granted:
            self.grants.append((now, tenant))
            heapq.heappush(self.running, (now + TURN, member))
        else:
            self.yields[tenant] += grant.reason == "fair_share"
            self._serial += 1
            heapq.heappush(self.held, (time.monotonic() + grant.wait, self._serial, tenant, member))

    def received(self, start: float, end: float) -> Counter[str | None]:
        return Counter(tenant for at, tenant in self.grants if start <= at < end)

    def first(self, tenant: str) -> float:
        return min(at for at, who in self.grants if who == tenant)


def _jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(value * value for value in values))


def _warm(fleet: Fleet) -> None:
    """The scope learns how long a turn takes (a fresh one assumes a second)."""
    for i in range(3):
        member = f"warm{i}"
        grant = limits.acquire(fleet.client, fleet.scope, member, interactive=False, hint_tokens=1, lease_seconds=30)
        assert grant.granted
        limits.release(fleet.client, fleet.scope, member, succeeded=True, seconds=TURN, estimate=1, tokens=0)


def test_tenants_share_the_threads_by_weight_while_a_flood_waits_in_the_queue(client: redis.Redis) -> None:
    fleet = Fleet(client=client, weights={"a": 1.0, "b": 1.0, "c": 2.0})
    _warm(fleet)
    start = time.monotonic()
    fleet.send("a", 500)  # a floods first: without the share b and c wait behind all of it (5.7 s)
    fleet.run_until(start + 0.5)
    fleet.send("b", 150)
    fleet.send("c", 150)
    joined = time.monotonic()
    fleet.run_until(joined + 3.5)
    assert fleet.first("b") - joined < 1.0 and fleet.first("c") - joined < 1.0
    got = fleet.received(joined + 1.0, joined + 3.0)  # a still has hundreds queued, b and c theirs
    assert sum(got.values()) >= 0.85 * 2.0 * RATE, got  # the threads stay used
    normalised = [got[tenant] / weight for tenant, weight in fleet.weights.items()]
    assert _jain(normalised) >= 0.95, got
    assert got["c"] > 1.5 * got["b"], got
    assert fleet.yields["a"] > 0


def test_a_tenant_arriving_behind_a_long_line_is_served_long_before_its_turn_in_the_fifo(client: redis.Redis) -> None:
    fleet = Fleet(client=client)
    _warm(fleet)
    start = time.monotonic()
    fleet.send("a", 500)
    fleet.run_until(start + 0.3)
    arrived = time.monotonic()
    fleet.send("b", 5)
    fleet.run_until(arrived + 2.0)
    # Behind a's ~480 queued turns it would start after about 6 s; the flood moves aside.
    assert fleet.first("b") - arrived < 1.5
    assert fleet.received(arrived, arrived + 2.0)["b"] == 5
    shares = {share.tenant: share for share in limits.shares(client, fleet.scope)}
    assert shares["a"].yielded > 0 and shares["b"].granted == 5


def test_one_tenant_alone_is_never_held_back(client: redis.Redis) -> None:
    fleet = Fleet(client=client)
    _warm(fleet)
    start = time.monotonic()
    fleet.send("a", 160)
    fleet.send(None, 40)  # sessions without a tenant beside it: no share to keep from them
    fleet.run_until(start + 3.0)
    assert not fleet.held and fleet.yields["a"] == 0
    assert len(fleet.grants) == 200
    # Every thread busy: 200 turns at 80 a second (the last starts at 2.4 s), as without the scope.
    assert max(at for at, _ in fleet.grants) - start < 2.4 + 0.3


def test_a_phantom_count_does_not_hold_another_tenant_back_for_long(client: redis.Redis) -> None:
    fleet = Fleet(client=client)
    _warm(fleet)
    # Tenant p's messages were counted but never reached the list (lost, purged, their sessions
    # deleted): its count says 20 wait. The list keeps moving with turns of no tenant.
    ghosts = [f"p-{i}" for i in range(20)]
    set_markers(client, ghosts, dict.fromkeys(ghosts, "p"))
    assert tenant_queue.waiting(client) == {"p": 20}
    start = time.monotonic()
    fleet.send("a", 40)
    fleet.send(None, 600)  # 7.5 s of turns without a tenant: the list stays long
    fleet.run_until(start + 4.5)
    # a yields to p until the list moves past where p's messages would have been plus
    # tenant_queue.QUEUE_SLACK takes (about 1.4 s here), and p's place in line lapses (1 s): then
    # a's turns run, long before the list is empty.
    assert fleet.received(start, start + 4.5)["a"] == 40
    assert tenant_queue.waiting(client) == {}  # believed no more, and set to 0


def test_a_phantom_count_quiet_while_the_list_is_empty_is_dropped_at_once(client: redis.Redis) -> None:
    fleet = Fleet(client=client)
    _warm(fleet)
    ghosts = [f"p-{i}" for i in range(5)]
    set_markers(client, ghosts, dict.fromkeys(ghosts, "p"))  # their messages were purged from the list
    client.hset(tenant_queue.QUEUED_KEY, "t:p", 0)  # ... long ago: the count has not moved since
    start = time.monotonic()
    fleet.send("a", 1)
    fleet.run_until(start + 0.2)  # a's turn asks with the list empty: nothing can be waiting there
    assert tenant_queue.waiting(client) == {}
    fleet.send("a", 100)  # a flood of a's now runs without yielding to p
    fleet.run_until(start + 2.0)
    assert fleet.yields["a"] == 0 and len(fleet.grants) == 101


def test_the_fleets_threads_are_the_live_entries(client: redis.Redis) -> None:
    assert threads.read_fleet(client) == 0
    assert threads.register(client, threads.Pool(node="w-1@a", threads=8), ttl=5) == 8
    assert threads.register(client, threads.Pool(node="w-2@a", threads=8), ttl=0.2) == 16
    assert threads.register(client, threads.Pool(node="w-1@b", threads=4), ttl=5) == 20
    time.sleep(0.3)
    # w-2@a stopped refreshing (killed): its threads leave the count, and its entry the hash.
    assert threads.read_fleet(client) == 12
    assert client.hexists(threads.FLEET_KEY, "w-2@a") is False
    threads.join_fleet("w-1@b", 4)
    threads.leave_fleet(client)  # a warm stop removes its entry at once
    assert threads.read_fleet(client) == 8


@pytest.fixture
def in_process_env() -> dict[str, str]:
    """The in-process runtime's weights (tests/integration/conftest.py)."""
    return {"CHATQ_TENANT_WEIGHTS": "a=1,b=1"}


def test_a_flood_moves_aside_through_the_real_runner_and_nothing_is_lost_or_reordered(
    client: redis.Redis, in_process: InProcessWorker, openai_stub: OpenAIStub, redis_url: str
) -> None:
    # The in-process worker's 4 threads are the fleet's (a worker registers them on its due timer).
    threads.join_fleet("in-process@test", in_process.threads)
    assert threads.refresh_fleet_threads(build_runtime()) == 0 and threads.fleet_threads() == 4
    openai_stub.latency = 0.1  # 40 turns a second on 4 threads
    try:
        a_sessions = [create_session(framework="none", model="stub-model", tenant="a") for _ in range(20)]
        a_turns = [
            submit_turn(session, f"a {session} {i}", queue=BATCH_QUEUE).turn_id
            for i in range(2)
            for session in a_sessions
        ]
        b_sessions = [create_session(framework="none", model="stub-model", tenant="b") for _ in range(4)]
        b_turns = [submit_turn(session, "b", queue=BATCH_QUEUE).turn_id for session in b_sessions]
        rows = wait_for_turns(a_turns + b_turns, timeout=60)
        in_process.wait_idle()
    finally:
        openai_stub.latency = 0.0
        threads.leave_fleet(client)
    assert {row.status.value for row in rows.values()} == {"succeeded"}
    for turn_id in a_turns + b_turns:  # one reply each, however often it was put back
        assert [m.role for m in turn_messages(turn_id)] == ["user", "assistant"]
        assert in_process.outcomes(turn_id).count("succeeded") == 1  # other copies (a busy session's) skipped
    for session in a_sessions:  # each session's turns in order: the second began after the first ended
        first, second = sorted((row for row in rows.values() if row.session_id == session), key=lambda r: r.position)
        assert first.finished_at is not None and second.started_at is not None
        assert second.started_at >= first.finished_at
    # b's turns were sent behind a's 20 (and the 20 second turns behind those): they ran early.
    a_ends = sorted(rows[t].finished_at for t in a_turns if rows[t].finished_at is not None)
    assert max(rows[t].finished_at for t in b_turns if rows[t].finished_at is not None) < a_ends[len(a_ends) // 2]
    reasons = {
        event.get("waiting", {}).get("reason")
        for turn_id in a_turns
        for event in replay_events(redis_url, turn_id)
        if event["type"] == "retry"
    }
    assert "fair_share" in reasons


def test_chatq_usage_counts_the_models_slots_not_the_threads(client: redis.Redis) -> None:
    model = Scope(key=f"usage-{uuid.uuid4().hex[:8]}@http://stub/v1", model="m", max_concurrent=4)
    pool = threads.threads_scope(THREADS)
    try:
        for scope in (model, pool):  # one turn of tenant u under both, as a batch turn with a model limit
            grant = limits.acquire(client, scope, "u1", interactive=False, hint_tokens=1, lease_seconds=30, tenant="u")
            assert grant.granted
        assert limits.slots_by_tenant(client).get("u") == 1
        assert {share.tenant: share.granted for share in limits.shares(client, pool)}["u"] == 1  # the metrics'
    finally:
        client.delete(*model.keys(), *model.share_keys())


def test_the_thread_share_can_be_switched_off(client: redis.Redis) -> None:
    session = ClaimedSession(
        id=uuid.uuid4(),
        agent_framework="none",
        model="stub-model",
        system_prompt=None,
        metadata={},
        knowledge_bases=(),
        tenant="a",
    )
    claim = Claim(
        turn_id=uuid.uuid4(),
        session=session,
        position=1,
        attempt=1,
        deliveries=1,
        lease_token=uuid.uuid4(),
        content="hi",
        images=None,
        reply_to=None,
        queue=BATCH_QUEUE,
    )
    threads.join_fleet("switch@test", 4)
    try:
        assert threads.refresh_fleet_threads(build_runtime()) == 0 and threads.fleet_threads() == 4
        runtime = build_runtime()
        slot = threads.admit(claim, runtime=runtime)
        assert slot is not None and slot.grant.granted  # on (the default): the turn holds a thread slot
        threads.finish(slot, claim, succeeded=False, runtime=runtime)
        off = replace(runtime, settings=replace(runtime.settings, thread_share=False))
        assert threads.admit(claim, runtime=off) is None  # off: no slot, no call
    finally:
        threads.leave_fleet(client)
