"""The journal of a turn's finished steps, as handlers/ sees it: a protocol, and what a resumed attempt starts from.

A turn's attempt can end before its reply (its worker killed, its lease lost, a shutdown, the one
retry after an `AgentInvocationError`, a wait for the model service). Each finished step is
recorded as it completes, so the next attempt continues after it instead of starting over:

- `model`: an assistant message that called tools, recorded right after the model returned it
  (before any of its tools runs), with that request's token usage;
- `tool_started`: a tool call about to run (recorded before it runs);
- `tool_result`: the call's result, as the `tool` message the turn stores.

handlers/ stays storage-free: the worker implements `Journal` on Postgres (`worker.store.journal`,
every write under the turn's lease) and hands it to `build_turn_input`, which reads `done` once;
`Resumed` is what the adapters start from. Without a journal (a caller of the public contract,
a test) nothing is recorded and every attempt starts over, as before.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from handlers.approvals import Decision
from handlers.messages import AgentMessage, ToolCall, Usage, empty_usage

__all__ = ["Journal", "Resumed", "Step", "StepKind"]


class StepKind(enum.StrEnum):
    """What a journal entry records."""

    MODEL = "model"
    """An assistant message that called tools, with its request's usage."""
    TOOL_STARTED = "tool_started"
    """A tool call about to run."""
    TOOL_RESULT = "tool_result"
    """A tool call's result (a `tool` message)."""
    APPROVAL_PENDING = "approval_pending"
    """A tool call that waits for a person's decision (`handlers.approvals`), with its arguments."""
    APPROVAL_DECIDED = "approval_decided"
    """A person's decision on a pending call (written by the store, not by an attempt)."""


@dataclass(frozen=True, kw_only=True)
class Step:
    """One journal entry of a turn."""

    seq: int
    """Its place in the turn's journal: 1, 2, ... in the order written."""
    kind: StepKind
    """What it records."""
    attempt: int
    """The attempt (handler invocation) that recorded it."""
    call_id: str | None = None
    """The tool call (`tool_started`, `tool_result`)."""
    tool_name: str | None = None
    """The tool's name (`tool_started`, `tool_result`)."""
    message: AgentMessage | None = None
    """The assistant message (`model`) or the tool message (`tool_result`); None for `tool_started`.
    A `tool_result`'s `citations` hold the knowledge-base hits the call found (never stored with the reply)."""
    usage: Usage | None = None
    """The model request's token usage (`model`)."""
    args: Mapping[str, Any] | None = None
    """The call's arguments as the model gave them (`approval_pending`)."""
    decision: Decision | None = None
    """The decision (`approval_decided`)."""
    at: float | None = field(default=None, compare=False)
    """Unix time it was recorded (as read from the journal; None for a step not read back). Not part of
    what a step records: two steps with the same content are equal whenever they were written."""


class Journal(Protocol):
    """Where a turn's attempt records its finished steps (the worker's, on Postgres, under the turn's lease).

    A write that cannot be made raises `handlers.errors.StepNotRecorded` (the attempt stops).
    """

    @property
    def done(self) -> Sequence[Step]:
        """The steps earlier attempts finished, in order (read once, when the attempt started)."""
        ...

    def model_step(self, message: AgentMessage, usage: Usage) -> None:
        """Record an assistant message that calls tools, right after the model returned it."""
        ...

    def tool_started(self, call_id: str, name: str) -> None:
        """Record that the call `call_id` of tool `name` is about to run."""
        ...

    def tool_finished(self, call_id: str, message: AgentMessage) -> None:
        """Record the call's result, the `tool` message answering it."""
        ...

    def approval_pending(self, call_id: str, name: str, args: Mapping[str, Any]) -> None:
        """Record that the call `call_id` of tool `name` waits for a person's decision (`handlers.approvals`)."""
        ...


@dataclass(frozen=True, kw_only=True)
class Resumed:
    """What an attempt starts from after earlier attempts' finished steps (`Resumed.of(journal.done)`)."""

    messages: tuple[AgentMessage, ...] = ()
    """The finished messages, in order, up to the last assistant message: those an uninterrupted run
    had produced by then. Results of the open round (below) are not among them: they come back
    from `results` when its calls are run again, so each message is produced once."""
    usage: Usage = field(default_factory=empty_usage)
    """The token usage of the finished model requests."""
    steps: int = 0
    """How many finished steps (model messages and tool results) there are: the attempt resumes after step `steps`."""
    pending: tuple[ToolCall, ...] = ()
    """The calls of the last assistant message when not all of them have a result (the open round), in order.
    An adapter runs them (through `handlers.tools.run_tool`) before it asks the model anything."""
    results: Mapping[str, str] = field(default_factory=dict)
    """Call id -> recorded result text, for calls of the open round that finished."""
    started: frozenset[str] = frozenset()
    """Calls of the open round that started but have no recorded result: their outcome is unknown."""
    hits: tuple[dict[str, Any], ...] = ()
    """Knowledge-base hits the finished searches found (citations are chosen from them)."""
    decisions: Mapping[str, Decision] = field(default_factory=dict)
    """Call id -> a person's decision, for calls of the open round (`handlers.approvals`)."""
    awaiting: frozenset[str] = frozenset()
    """Calls of the open round recorded as waiting for a decision that has not been made."""

    @classmethod
    def of(cls, steps: Sequence[Step]) -> Resumed:
        """Derive the resume point from a turn's journal entries."""
        messages: list[AgentMessage] = []
        usage = empty_usage()
        hits: list[dict[str, Any]] = []
        results: dict[str, AgentMessage] = {}
        started: set[str] = set()
        decisions: dict[str, Decision] = {}
        waiting: set[str] = set()
        last_model = -1
        count = 0
        for step in sorted(steps, key=lambda s: s.seq):
            if step.kind is StepKind.MODEL and step.message is not None:
                count += 1
                last_model = len(messages)
                messages.append(step.message)
                results, started, decisions, waiting = {}, set(), {}, set()
                for key in usage:
                    usage[key] += int((step.usage or {}).get(key, 0))
            elif step.kind is StepKind.APPROVAL_PENDING and step.call_id is not None:
                waiting.add(step.call_id)
            elif step.kind is StepKind.APPROVAL_DECIDED and step.call_id is not None and step.decision is not None:
                decisions[step.call_id] = step.decision
            elif step.kind is StepKind.TOOL_STARTED and step.call_id is not None:
                started.add(step.call_id)
            elif step.kind is StepKind.TOOL_RESULT and step.call_id is not None and step.message is not None:
                count += 1
                hits.extend(step.message.citations or ())
                tool_message = replace(step.message, citations=None)
                results[step.call_id] = tool_message
                messages.append(tool_message)
        if last_model < 0:
            return cls(steps=count, hits=tuple(hits))
        calls = tuple(messages[last_model].tool_calls or ())
        if all(call.get("id") in results for call in calls):
            return cls(messages=tuple(messages), usage=usage, steps=count, hits=tuple(hits))
        # The open round: its finished results are produced again (from `results`) when its calls run.
        return cls(
            messages=tuple(messages[: last_model + 1]),
            usage=usage,
            steps=count,
            pending=calls,
            results={call_id: message.content for call_id, message in results.items()},
            started=frozenset(started - set(results)),
            hits=tuple(hits),
            decisions=decisions,
            awaiting=frozenset(waiting - set(decisions)),
        )
