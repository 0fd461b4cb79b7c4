"""The journal of a running turn's finished steps on Postgres (`turn_steps`): the worker's `handlers.journal.Journal`.

An attempt opens the journal when it starts (`TurnJournal.open`: the steps earlier attempts
finished, read once) and hands it to `build_turn_input`; the adapters and `run_tool` record each
step as it finishes. Every write is one INSERT that succeeds only while the turn is still running
under this attempt's lease token, as every other write of a running turn (`worker.store.claims`):
an attempt that lost its turn to another cannot add a step, and its run stops
(`StepNotRecorded(stale=True)`). The engine is handed in.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, RowMapping, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from chatq.text import clean_json, clean_text
from handlers.approvals import Decision
from handlers.errors import StepNotRecorded
from handlers.journal import Step, StepKind
from handlers.messages import AgentMessage, Usage
from models.db import autocommit_scope

__all__ = ["TurnJournal", "read_steps"]

READ = text(
    """
    SELECT seq, kind, attempt, call_id, tool_name, message, usage,
           CAST(extract(epoch FROM created_at) AS float8) AS at
    FROM turn_steps WHERE turn_id = :turn_id ORDER BY seq
    """
)

WRITE = text(
    """
    -- Only while this attempt holds the turn: running, under its lease token.
    INSERT INTO turn_steps (turn_id, seq, kind, attempt, call_id, tool_name, message, usage)
    SELECT t.id, :seq, :kind, :attempt, :call_id, :tool_name, :message, :usage
    FROM turns t
    WHERE t.id = :turn_id AND t.status = 'running' AND t.lease_token = :token
    ON CONFLICT (turn_id, seq) DO NOTHING
    RETURNING seq
    """
).bindparams(bindparam("message", type_=JSONB), bindparam("usage", type_=JSONB))

_FINISHED = (StepKind.MODEL, StepKind.TOOL_RESULT)
"""The kinds that are finished steps (where a next attempt resumes); the rest only say what happens."""

STALE = "this attempt no longer holds the turn (it was taken over or ended); its step was not recorded"


def read_steps(db: Connection, turn_id: uuid.UUID) -> list[Step]:
    """A turn's journal entries in order (`db`: any connection or session)."""
    return [_step(row) for row in db.execute(READ, {"turn_id": turn_id}).mappings()]


def _step(row: RowMapping) -> Step:
    kind = StepKind(row["kind"])
    message = row["message"]
    common: dict[str, Any] = {
        "seq": int(row["seq"]),
        "kind": kind,
        "attempt": int(row["attempt"]),
        "at": row["at"],
        "call_id": row["call_id"],
        "tool_name": row["tool_name"],
    }
    if kind is StepKind.APPROVAL_PENDING:
        args = (message or {}).get("args")
        return Step(**common, args=dict(args) if isinstance(args, dict) else {})
    if kind is StepKind.APPROVAL_DECIDED:
        return Step(**common, decision=Decision.from_dict(message or {}))
    return Step(
        **common,
        message=AgentMessage.from_dict(message) if message else None,
        usage={str(key): int(value) for key, value in (row["usage"] or {}).items()} or None,
    )


class TurnJournal:
    """One attempt's journal: the steps done before it, and its own writes under its lease."""

    def __init__(
        self, engine: Engine, *, turn_id: uuid.UUID, lease_token: uuid.UUID, attempt: int, done: Sequence[Step]
    ) -> None:
        self._engine = engine
        self.turn_id = turn_id
        self.lease_token = lease_token
        self.attempt = attempt
        self._done = tuple(done)
        self._lock = threading.Lock()
        self._next = max((step.seq for step in self._done), default=0) + 1
        self._finished = sum(step.kind in _FINISHED for step in self._done)
        self._usage: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for step in self._done:
            self._count(step.usage)
        self._watch: Callable[[Usage], None] | None = None

    def watch(self, check: Callable[[Usage], None]) -> None:
        """Call `check` with `usage` after each finished step is recorded (a model message, a tool
        result); what it raises (`handlers.errors.BudgetSpent`) stops the attempt there."""
        self._watch = check

    @property
    def usage(self) -> Usage:
        """The token usage of the recorded model steps, earlier attempts' included (not stored on the turn yet)."""
        return dict(self._usage)

    def _count(self, usage: Mapping[str, Any] | None) -> None:
        for key in self._usage:
            self._usage[key] += int((usage or {}).get(key, 0))

    @classmethod
    def open(cls, engine: Engine, *, turn_id: uuid.UUID, lease_token: uuid.UUID, attempt: int) -> TurnJournal:
        """The journal of a claimed turn, with the steps earlier attempts finished (one indexed read)."""
        # One statement, so no transaction: the ROLLBACK that would end a read-only one makes
        # psycopg deallocate every prepared statement of the pooled connection (the claim's,
        # the reply's...), which each turn then prepares again: 6 to 9 ms a turn (BENCHMARKS.md).
        with autocommit_scope(engine) as db:
            done = read_steps(db, turn_id)
        return cls(engine, turn_id=turn_id, lease_token=lease_token, attempt=attempt, done=done)

    @property
    def done(self) -> Sequence[Step]:
        """The steps earlier attempts finished, in order (as read when the attempt started)."""
        return self._done

    @property
    def finished_steps(self) -> int:
        """Finished steps (model messages and tool results) so far, this attempt's included: where
        the next attempt would resume (the `resumed_after` of a `retry` event)."""
        return self._finished

    def model_step(self, message: AgentMessage, usage: Usage) -> None:
        """Record an assistant message that calls tools, with its request's usage."""
        self._write(StepKind.MODEL, message=message.to_dict(), usage=dict(usage))
        self._checked()

    def tool_started(self, call_id: str, name: str) -> None:
        """Record that a tool call is about to run."""
        self._write(StepKind.TOOL_STARTED, call_id=call_id, tool_name=name)

    def tool_finished(self, call_id: str, message: AgentMessage) -> None:
        """Record a tool call's result (its `tool` message)."""
        self._write(StepKind.TOOL_RESULT, call_id=call_id, message=message.to_dict())
        self._checked()

    def _checked(self) -> None:
        if self._watch is not None:
            self._watch(self.usage)

    def approval_pending(self, call_id: str, name: str, args: Mapping[str, Any]) -> None:
        """Record that a tool call waits for a person's decision (`handlers.approvals`), with its arguments."""
        self._write(StepKind.APPROVAL_PENDING, call_id=call_id, tool_name=name, message={"args": dict(args)})

    def _write(
        self,
        kind: StepKind,
        *,
        call_id: str | None = None,
        tool_name: str | None = None,
        message: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        with self._lock:
            params = {
                "turn_id": self.turn_id,
                "token": self.lease_token,
                "seq": self._next,
                "kind": kind.value,
                "attempt": self.attempt,
                "call_id": clean_text(call_id[:255]) if call_id is not None else None,
                "tool_name": clean_text(tool_name[:64]) if tool_name is not None else None,
                # As the reply is stored (`worker.runtime.delivery.replies`): no NUL or lone surrogate reaches Postgres.
                "message": clean_json(message),
                "usage": usage,
            }
            try:
                # One statement, atomic on its own: no transaction around it (one round trip).
                with self._engine.connect() as db:
                    written = (
                        db.execution_options(isolation_level="AUTOCOMMIT").execute(WRITE, params).scalar_one_or_none()
                    )
            except Exception as exc:
                raise StepNotRecorded(f"a step of the turn could not be recorded ({type(exc).__name__})") from exc
            if written is None:
                raise StepNotRecorded(STALE, stale=True)
            self._next += 1
            self._count(usage)
            if kind in _FINISHED:
                self._finished += 1
