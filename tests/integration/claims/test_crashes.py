"""Which crashes count against a turn (poison), against the real Postgres, no worker.

A dead worker is simulated as it looks in Postgres: its turns stay `running` and their leases,
last renewed together, run out. Another worker then takes them over, either by claiming the
turn (a redelivered message finds the expired lease) or after the sweeper released it (its
re-sent message claims it `queued`). Every case runs with both claim paths: `claim_turn` (the
one-statement claim, falling back to the slow one) and `_claim_slow` alone (the read-only query
that says why first, then the take-over, poison or claim statement it calls for).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

import pytest
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Uuid

from chatq.settings import get_settings
from models.db import get_engine, session_scope
from models.tables import Turn, TurnStatus
from worker.producer import create_session, submit_turn
from worker.runtime.recovery.sweeper import stale_turns
from worker.store.claims import ClaimResult, ClaimStatus, _claim_slow, claim_turn
from worker.store.transition_sql import FAST_CLAIM
from worker.store.turns import poison_reason

pytestmark = pytest.mark.usefixtures("chatq_env")

Claimer = Callable[..., ClaimResult]
CLAIMERS = [pytest.param(claim_turn, id="claim_turn"), pytest.param(_claim_slow, id="slow_path")]
TAKEOVERS = ["claim", "sweep"]


def _node(name: str, host: str) -> str:
    """A Celery node name, unique to this test (the database is shared by the run's tests)."""
    return f"{name}-{uuid.uuid4().hex[:8]}@{host}"


def _turn() -> uuid.UUID:
    return submit_turn(create_session(framework="none", model="echo"), "hello").turn_id


def _start(claim: Claimer, worker: str, count: int = 1) -> list[uuid.UUID]:
    """`count` new turns (one per session) running on `worker`."""
    turn_ids = [_turn() for _ in range(count)]
    for turn_id in turn_ids:
        assert claim(turn_id, worker=worker, engine=get_engine(), settings=get_settings()).status is ClaimStatus.CLAIMED
    return turn_ids


_STOP = text(
    """
    UPDATE turns t SET lease_expires_at = now() - interval '2 seconds' + r.n * interval '0.1 second'
    FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM turns WHERE id = ANY(:ids)) r
    WHERE t.id = r.id AND t.status = 'running'
    """
).bindparams(bindparam("ids", type_=ARRAY(Uuid)))


def _stop(turn_ids: Sequence[uuid.UUID]) -> None:
    """The process running these turns dies: their leases, renewed together until then, run out.

    They expire a little apart (0.1 s each), as turns claimed between two renewals do.
    """
    with session_scope() as db:
        db.execute(_STOP, {"ids": list(turn_ids)})


def _take_over(claim: Claimer, how: str, turn_ids: Sequence[uuid.UUID], worker: str) -> list[ClaimResult]:
    """Another worker takes the turns: one by one, or after one sweep released them all."""
    if how == "sweep":
        _, expired = stale_turns(
            grace_seconds=3600, engine=get_engine(), renewal_interval=get_settings().renewal_interval
        )
        assert set(turn_ids) <= set(expired)
    return [claim(turn_id, worker=worker, engine=get_engine(), settings=get_settings()) for turn_id in turn_ids]


def _rows(turn_ids: Sequence[uuid.UUID]) -> list[Turn]:
    with session_scope() as db:
        rows = {row.id: row for row in db.execute(select(Turn).where(Turn.id.in_(turn_ids))).scalars()}
        db.expunge_all()
    return [rows[turn_id] for turn_id in turn_ids]


@pytest.mark.parametrize("claim", CLAIMERS)
def test_turns_of_a_worker_that_keeps_dying_are_never_poison(claim: Claimer) -> None:
    """The red team's case: a busy worker killed again and again; its turns only happened to run on it."""
    max_deliveries = get_settings().max_deliveries
    # A restarted worker usually gets its node name back; here it does in every other round.
    names = [_node("w", "host-a"), _node("v", "host-a")]
    turn_ids = _start(claim, names[0], count=4)
    rounds = max_deliveries + 2
    for n in range(rounds):
        _stop(turn_ids)
        worker = names[(n + 1) % 2]
        # Half are taken over one by one (each sees the others still on the dead worker), then
        # one sweep releases the rest (they see the first half already moved on).
        results = _take_over(claim, "claim", turn_ids[:2], worker) + _take_over(claim, "sweep", turn_ids[2:], worker)
        assert [r.status for r in results] == [ClaimStatus.CLAIMED] * 4, [r.error for r in results]
    for row in _rows(turn_ids):
        assert row.status is TurnStatus.RUNNING
        assert (row.deliveries, row.lone_crashes, row.crash_hosts) == (rounds + 1, 0, ["host-a"])


@pytest.mark.parametrize("claim", CLAIMERS)
@pytest.mark.parametrize("first", TAKEOVERS)
def test_turns_that_stopped_together_do_not_count_whichever_moves_first(claim: Claimer, first: str) -> None:
    dead = _node("w", "host-a")
    a, b = _start(claim, dead, count=2)
    # Only a's lease has run out so far; b's (renewed by the same query) runs out a moment later.
    with session_scope() as db:
        db.execute(update(Turn).where(Turn.id == a).values(lease_expires_at=text("now() - interval '0.2 second'")))
        db.execute(update(Turn).where(Turn.id == b).values(lease_expires_at=text("now() + interval '0.6 second'")))
    (taken,) = _take_over(claim, first, [a], _node("x", "host-a"))
    assert taken.status is ClaimStatus.CLAIMED
    # b is taken over once its lease has really run out (a is long gone from the dead worker).
    deadline = time.monotonic() + 10
    while (
        claim(b, worker=_node("y", "host-a"), engine=get_engine(), settings=get_settings()).status is ClaimStatus.BUSY
    ):
        assert time.monotonic() < deadline, "b's lease never ran out"
        time.sleep(0.05)
    assert [(row.status, row.deliveries, row.lone_crashes) for row in _rows([a, b])] == [
        (TurnStatus.RUNNING, 2, 0),
        (TurnStatus.RUNNING, 2, 0),
    ]
    assert {row.stopped_worker for row in _rows([a, b])} == {dead}


@pytest.mark.parametrize("claim", CLAIMERS)
@pytest.mark.parametrize("how", TAKEOVERS)
def test_a_turn_alone_on_the_worker_it_stops_is_failed_after_max_deliveries(claim: Claimer, how: str) -> None:
    max_deliveries = get_settings().max_deliveries
    node = _node("solo", "host-a")
    (poison,) = _start(claim, node)
    # Another process of the same node (or the worker restarted under the node's name) runs a
    # turn meanwhile: its lease is live, a lease length ahead, so it did not stop with the poison.
    (bystander,) = _start(claim, node)
    results = []
    for _ in range(max_deliveries):
        _stop([poison])
        results += _take_over(claim, how, [poison], node)
    assert [r.status for r in results] == [ClaimStatus.CLAIMED] * (max_deliveries - 1) + [ClaimStatus.POISONED]
    expected = (
        f"the turn was abandoned: it was the only turn running each of the {max_deliveries} times its worker "
        f"stopped (CHATQ_MAX_DELIVERIES={max_deliveries})"
    )
    assert results[-1].error == expected
    row, other = _rows([poison, bystander])
    assert (row.status, row.error, row.deliveries, row.lone_crashes) == (
        TurnStatus.FAILED,
        expected,
        max_deliveries,
        max_deliveries,
    )
    assert (other.status, other.deliveries, other.lone_crashes) == (TurnStatus.RUNNING, 1, 0)


@pytest.mark.parametrize("claim", CLAIMERS)
@pytest.mark.parametrize("how", TAKEOVERS)
def test_a_turn_that_stops_workers_on_two_hosts_is_failed_after_max_deliveries(claim: Claimer, how: str) -> None:
    """Never alone (each worker ran another turn too), but the one turn present wherever workers died."""
    max_deliveries = get_settings().max_deliveries
    hosts = ["host-a", "host-b"]
    worker = _node("w", hosts[0])
    (poison,) = _start(claim, worker)
    bystanders: list[uuid.UUID] = []
    results = []
    for n in range(max_deliveries):
        bystanders += _start(claim, worker)
        _stop([poison, bystanders[-1]])
        worker = _node("w", hosts[(n + 1) % 2])
        results += _take_over(claim, how, [poison, bystanders[-1]], worker)
    poisoned = [r.status for r in results[0::2]]
    assert poisoned == [ClaimStatus.CLAIMED] * (max_deliveries - 1) + [ClaimStatus.POISONED]
    assert [r.status for r in results[1::2]] == [ClaimStatus.CLAIMED] * max_deliveries
    expected = (
        f"the turn was abandoned: it stopped workers on 2 hosts, {max_deliveries} times in all "
        f"(CHATQ_MAX_DELIVERIES={max_deliveries})"
    )
    (row,) = _rows([poison])
    assert (row.status, row.error, row.lone_crashes, sorted(row.crash_hosts)) == (TurnStatus.FAILED, expected, 0, hosts)
    assert all(row.lone_crashes == 0 and row.deliveries == 2 for row in _rows(bystanders))


def test_the_one_statement_claim_takes_exactly_the_turns_that_are_not_poison() -> None:
    """Both claim paths agree on every count of crashes a queued turn can carry (sweeper-released)."""
    max_deliveries = get_settings().max_deliveries
    cases = [
        (deliveries, lone, hosts)
        for deliveries in range(max_deliveries + 2)
        for lone in range(deliveries + 1)
        for hosts in range(min(deliveries, 3) + 1)
    ]
    verdicts = set()
    for deliveries, lone, hosts in cases:
        fast, slow = _turn(), _turn()
        with session_scope() as db:
            db.execute(
                update(Turn)
                .where(Turn.id.in_([fast, slow]))
                .values(deliveries=deliveries, lone_crashes=lone, crash_hosts=[f"host-{h}" for h in range(hosts)])
            )
        (row,) = _rows([fast])
        reason = poison_reason(row, max_deliveries=max_deliveries)
        case = f"deliveries={deliveries} lone={lone} hosts={hosts}: {reason}"
        # The statement itself, rolled back: it claims a turn exactly when it is not poison.
        with get_engine().connect() as connection, connection.begin() as transaction:
            params = {
                "turn_id": fast,
                "token": uuid.uuid4(),
                "lease_seconds": 30,
                "worker": "w@h",
                "max_deliveries": max_deliveries,
            }
            assert (connection.execute(FAST_CLAIM, params).one_or_none() is not None) == (reason is None), case
            transaction.rollback()
        outcomes = [
            claim_turn(fast, worker="w@h", engine=get_engine(), settings=get_settings()),
            _claim_slow(slow, worker="w@h", engine=get_engine(), settings=get_settings()),
        ]
        assert [(r.status, r.error) for r in outcomes] == [
            (ClaimStatus.CLAIMED, None) if reason is None else (ClaimStatus.POISONED, reason)
        ] * 2, case
        assert len({(r.status, r.deliveries, r.error) for r in _rows([fast, slow])}) == 1, case
        verdicts.add(reason is None)
    assert verdicts == {True, False}, "the cases should include both poison and not"
