"""Random interleavings of every turn transition (worker/store/claims.py) against the real Postgres.

A hypothesis state machine inserts, claims (through the one-statement claim and the slow path),
completes, fails, cancels, retries and hands back turns of a few sessions from a few workers,
lets leases run out (a worker dies: its lease is moved into the past, as in test_crashes.py) and
sweeps; stale claims (zombies) keep trying to end their turns. A small model predicts each
outcome, and after every step the stored rows must keep the invariants: at most one running turn
per session, turns of a session start in position order and never while an earlier one is
unfinished, at most one stored reply per turn, a finished turn never changes again. The fast
claim's statement, run and rolled back, must take exactly the turns the model (and so the slow
path, checked against the same model) would.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import func, select, text, update

from chatq.settings import get_settings
from handlers.base import AgentMessage
from models.db import autocommit_scope, get_engine, session_scope
from models.tables import ChatMessage, Turn, TurnStatus
from worker.gateway.store import session_start
from worker.payload import TurnRequest
from worker.producer import create_session
from worker.runtime.recovery.sweeper import stale_turns
from worker.store import claims
from worker.store.claims import Claim, ClaimStatus
from worker.store.transition_sql import FAST_CLAIM
from worker.store.turns import next_runnable, poison_reason

pytestmark = pytest.mark.usefixtures("chatq_env")

SESSIONS = 2
PLAN = (
    ("claim",) * 5
    + ("insert",) * 2
    + ("complete",) * 2
    + ("finish", "requeue", "cancel", "worker_dies", "worker_dies", "sweep", "next_turn")
    + ("fast_claim_agrees",) * 2
)
"""The transitions and checks a step draws from, each as often as it appears."""
USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


@dataclass(kw_only=True)
class ModelTurn:
    """What the model expects of one turn."""

    id: uuid.UUID
    """The turn id."""
    session: int
    """Index of its session in the machine's sessions."""
    position: int
    """Its position in the session."""
    status: TurnStatus = TurnStatus.QUEUED
    """The status it must have."""
    token: uuid.UUID | None = None
    """The lease token of the claim that runs it."""
    expired: bool = False
    """Its worker stopped: the lease ran out."""
    cancel_requested: bool = False
    """Cancelling was asked while it ran."""
    attempts: int = 0
    """The handler invocations counted so far."""
    snapshot: tuple[Any, ...] | None = field(default=None)
    """Its stored row once finished, which must never change again."""


class TurnMachine(RuleBasedStateMachine):
    """The transitions as rules; the invariants checked after each."""

    def __init__(self) -> None:
        super().__init__()
        tag = uuid.uuid4().hex[:8]
        self.workers = [f"a-{tag}@host-a", f"b-{tag}@host-a", f"c-{tag}@host-b"]
        self.sessions = [create_session(framework="none", model="echo") for _ in range(SESSIONS)]
        self.turns: list[ModelTurn] = []
        self.claims: list[Claim] = []
        self.started: dict[int, list[int]] = {n: [] for n in range(SESSIONS)}

    # -- the model ----------------------------------------------------------------------------

    def _turn(self, data: st.DataObject) -> ModelTurn:
        # Mostly unfinished turns, where the transitions have something to decide.
        unfinished = [t for t in self.turns if not t.status.finished]
        return data.draw(st.sampled_from(unfinished if unfinished and data.draw(st.integers(0, 4)) else self.turns))

    def _claim(self, data: st.DataObject) -> Claim:
        # Mostly the claims that still own their turn; the others are zombies.
        owning = [c for c in self.claims if self._owns(c)]
        return data.draw(st.sampled_from(owning if owning and data.draw(st.integers(0, 3)) else self.claims))

    def _by_id(self, turn_id: uuid.UUID) -> ModelTurn:
        return next(t for t in self.turns if t.id == turn_id)

    def _head(self, session: int) -> ModelTurn | None:
        unfinished = [t for t in self.turns if t.session == session and not t.status.finished]
        return min(unfinished, key=lambda t: t.position, default=None)

    def _expected_next(self, session: int) -> uuid.UUID | None:
        head = self._head(session)
        return head.id if head is not None and head.status is TurnStatus.QUEUED else None

    def _owns(self, claim: Claim) -> bool:
        turn = self._by_id(claim.turn_id)
        return turn.status is TurnStatus.RUNNING and turn.token == claim.lease_token

    def _claim_verdict(self, turn: ModelTurn) -> ClaimStatus | None:
        """What a claim must answer, in the slow path's order; None: claimed, unless poison."""
        if turn.status.finished:
            return ClaimStatus.FINISHED
        if turn.status is TurnStatus.RUNNING and not turn.expired:
            return ClaimStatus.BUSY
        if self._head(turn.session) is not turn:
            return ClaimStatus.BLOCKED
        if turn.cancel_requested:
            return ClaimStatus.CANCELLED
        return None

    def _end(self, turn: ModelTurn, status: TurnStatus) -> None:
        turn.status, turn.token, turn.expired = status, None, False

    # -- the transitions ----------------------------------------------------------------------

    @rule(action=st.sampled_from(PLAN), data=st.data())
    def step(self, action: str, data: st.DataObject) -> None:
        """One transition, drawn by weight from PLAN.

        One rule rather than one per transition: hypothesis's swarm testing would switch
        transitions off for whole runs, and most steps would then find nothing to act on.
        """
        getattr(self, action)(data)

    def insert(self, data: st.DataObject) -> None:
        if sum(not t.status.finished for t in self.turns) >= 5:
            return
        session = data.draw(st.integers(0, SESSIONS - 1))
        request = TurnRequest(turn_id=uuid.uuid4(), session_id=self.sessions[session], content="hello")
        with autocommit_scope() as db:
            position = claims.insert_turn(db, request, queue="chatq")
        assert position == sum(1 for t in self.turns if t.session == session)
        self.turns.append(ModelTurn(id=request.turn_id, session=session, position=position))

    def claim(self, data: st.DataObject) -> None:
        if not self.turns:
            return
        turn, worker, fast = self._turn(data), data.draw(st.integers(0, 2)), data.draw(st.booleans())
        verdict = self._claim_verdict(turn)
        taken_over = turn.status is TurnStatus.RUNNING
        before = _row(turn.id)
        claim = claims.claim_turn if fast else claims._claim_slow
        result = claim(turn.id, worker=self.workers[worker], engine=get_engine(), settings=get_settings())
        event(f"claim ({'fast' if fast else 'slow'}, {turn.status}, expired={turn.expired}): {result.status}")
        if verdict is not None:
            assert result.status is verdict, (result, turn)
        else:
            # Poison is decided from the crash counts; an expired lease records its stop first, and
            # the claim's own delivery is counted after the decision.
            decided = _row(turn.id) if taken_over else before
            if taken_over and result.status is ClaimStatus.CLAIMED:
                decided.deliveries -= 1
            reason = poison_reason(decided, max_deliveries=get_settings().max_deliveries)
            expected = ClaimStatus.CLAIMED if reason is None else ClaimStatus.POISONED
            assert (result.status, result.error) == (expected, reason), (result, turn)
        if result.status is ClaimStatus.CLAIMED:
            assert result.claim is not None and result.claim.attempt == turn.attempts + 1
            assert all(p <= turn.position for p in self.started[turn.session]), "started out of order"
            self.started[turn.session].append(turn.position)
            turn.status, turn.token, turn.expired = TurnStatus.RUNNING, result.claim.lease_token, False
            turn.attempts += 1
            self.claims.append(result.claim)
        elif result.status is ClaimStatus.CANCELLED:
            self._end(turn, TurnStatus.CANCELLED)
        elif result.status is ClaimStatus.POISONED:
            self._end(turn, TurnStatus.FAILED)

    def complete(self, data: st.DataObject) -> None:
        if not self.claims:
            return
        claim = self._claim(data)
        owned = self._owns(claim)
        reply = [AgentMessage(role="assistant", content="reply")]
        done = claims.complete_turn(claim, reply, USAGE, engine=get_engine())
        event(f"complete: stored={done.stored}")
        assert done.stored == owned
        if owned:
            turn = self._by_id(claim.turn_id)
            self._end(turn, TurnStatus.SUCCEEDED)
            assert (done.next_turn.turn_id if done.next_turn else None) == self._expected_next(turn.session)

    def finish(self, data: st.DataObject) -> None:
        if not self.claims:
            return
        claim, status = self._claim(data), data.draw(st.sampled_from([TurnStatus.FAILED, TurnStatus.CANCELLED]))
        owned = self._owns(claim)
        done = claims.finish_turn(claim, status, "boom" if status is TurnStatus.FAILED else None, engine=get_engine())
        assert done.stored == owned
        if owned:
            turn = self._by_id(claim.turn_id)
            self._end(turn, status)
            assert (done.next_turn.turn_id if done.next_turn else None) == self._expected_next(turn.session)

    def requeue(self, data: st.DataObject) -> None:
        if not self.claims:
            return
        claim, hand_back = self._claim(data), data.draw(st.booleans())
        owned = self._owns(claim)
        assert (
            claims.requeue_turn(claim, error=None if hand_back else "retry", hand_back=hand_back, engine=get_engine())
            == owned
        )
        if owned:
            turn = self._by_id(claim.turn_id)
            self._end(turn, TurnStatus.QUEUED)
            if hand_back:  # the invocation is given back, not counted
                turn.attempts -= 1

    def cancel(self, data: st.DataObject) -> None:
        if not self.turns:
            return
        turn = self._turn(data)
        with session_scope() as db:
            changed = claims.request_cancel(db, [turn.id])
        if turn.status.finished:
            assert changed == {}
            return
        if turn.status is TurnStatus.QUEUED:
            self._end(turn, TurnStatus.CANCELLED)
        turn.cancel_requested = True
        assert changed == {turn.id: turn.status}

    def worker_dies(self, data: st.DataObject) -> None:
        running = [t for t in self.turns if t.status is TurnStatus.RUNNING and not t.expired]
        if not running:
            return
        turn = data.draw(st.sampled_from(running))
        with session_scope() as db:
            stopped = text("now() - interval '5 seconds'")
            db.execute(update(Turn).where(Turn.id == turn.id).values(lease_expires_at=stopped))
        turn.expired = True

    def sweep(self, data: st.DataObject) -> None:
        _, expired = stale_turns(
            grace_seconds=3600, engine=get_engine(), renewal_interval=get_settings().renewal_interval
        )
        mine = {t.id for t in self.turns}
        assert mine & set(expired) == {t.id for t in self.turns if t.status is TurnStatus.RUNNING and t.expired}
        for turn in self.turns:
            if turn.id in expired:
                self._end(turn, TurnStatus.QUEUED)

    def next_turn(self, data: st.DataObject) -> None:
        session = data.draw(st.integers(0, SESSIONS - 1))
        found = next_runnable(self.sessions[session], engine=get_engine())
        assert (found.turn_id if found else None) == self._expected_next(session)

    def fast_claim_agrees(self, data: st.DataObject) -> None:
        """The one-statement claim, rolled back, takes the turn exactly when the model would."""
        if not self.turns:
            return
        turn = self._turn(data)
        max_deliveries = get_settings().max_deliveries
        would = (
            turn.status is TurnStatus.QUEUED
            and self._claim_verdict(turn) is None
            and poison_reason(_row(turn.id), max_deliveries=max_deliveries) is None
        )
        params = {
            "turn_id": turn.id,
            "token": uuid.uuid4(),
            "lease_seconds": 30,
            "worker": "probe@host",
            "max_deliveries": max_deliveries,
        }
        with get_engine().connect() as connection, connection.begin() as transaction:
            claimed = connection.execute(FAST_CLAIM, params).one_or_none() is not None
            transaction.rollback()
        assert claimed == would, turn

    # -- the invariants -----------------------------------------------------------------------

    @invariant()
    def rows_keep_the_invariants(self) -> None:
        ids = [t.id for t in self.turns]
        with session_scope() as db:
            rows = {row.id: row for row in db.execute(select(Turn).where(Turn.id.in_(ids))).scalars()}
            replies = dict(
                db.execute(
                    select(ChatMessage.turn_id, func.count())
                    .where(ChatMessage.turn_id.in_(ids), ChatMessage.role == "assistant")
                    .group_by(ChatMessage.turn_id)
                ).all()
            )
            db.expunge_all()
        for turn in self.turns:
            row = rows[turn.id]
            assert (row.status, row.cancel_requested, row.attempts) == (
                turn.status,
                turn.cancel_requested,
                turn.attempts,
            ), turn
            assert row.lease_token == turn.token, turn
            # At most one stored reply per turn: exactly one once it succeeded.
            assert replies.get(turn.id, 0) == (1 if turn.status is TurnStatus.SUCCEEDED else 0), turn
            if turn.status.finished:
                snapshot = (row.status, row.error, row.finished_at, row.attempts, row.total_tokens, row.history_turns)
                turn.snapshot = turn.snapshot or snapshot
                assert snapshot == turn.snapshot, f"finished turn {turn.id} changed"
        for session in range(SESSIONS):
            mine = sorted((rows[t.id] for t in self.turns if t.session == session), key=lambda r: r.position)
            running = [r for r in mine if r.status is TurnStatus.RUNNING]
            assert len(running) <= 1, "two turns of a session running"
            for r in running:
                assert all(e.status.finished for e in mine if e.position < r.position), "ran before an earlier turn"
            head = self._head(session)
            start, _ = session_start(self.sessions[session])
            assert start == (head.position if head is not None else len(mine))


def _row(turn_id: uuid.UUID) -> Turn:
    with session_scope() as db:
        row = db.execute(select(Turn).where(Turn.id == turn_id)).scalar_one()
        db.expunge(row)
        return row


@pytest.mark.slow  # hundreds of random interleavings
def test_random_interleavings_of_transitions_keep_the_invariants() -> None:
    run_state_machine_as_test(
        TurnMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            database=None,
            derandomize=True,
            # No shrinking: every replay is a round of real database work; the failing steps print as run.
            phases=[Phase.explicit, Phase.generate],
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
