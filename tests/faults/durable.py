"""Helpers of the durable-steps fault tests (tests/faults/test_durable_steps.py): turns of several tool
rounds held at a chosen point, the worker relay the scenarios share, and what a resumed turn must show.

The model stub holds a turn's Nth request (`[sleep-at: KEY N S]`) and the side-effect tool
(`tests.support.effects`) holds its call after its write (`sleep`), so a fault lands while that
request or call is in flight. Workers load the tool as a plugin and sweep by themselves.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.tables import ChatMessage, Turn
from tests.faults.helpers import STUB_MODEL, Worker, Workers, load_turns
from tests.support.effects import EFFECT, lines
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import replay_events, turn_messages
from worker.producer import create_session, submit_turn
from worker.queries import turn_report

FRAMEWORKS = ("langgraph", "plain_openai")
ROUNDS = 4
"""Tool rounds of a turn: the model is asked ROUNDS + 1 times when nothing goes wrong."""
IN_FLIGHT = 3
"""The model request a fault lands in (two rounds are finished by then: four steps)."""
NEVER = 99
"""A request number no turn reaches: the fault-free turns carry the same directives (same usage)."""
SLOTS = 4
"""Each worker's concurrency; a scenario that stops a worker fills every slot, so the stopped worker
holds no pending fetch from the queue (it would swallow the turns the sweeper sends again)."""
PLUGIN_ENV = {"CHATQ_PLUGINS": "tests.support.effects", "CHATQ_WORKER_SWEEP": "on"}
"""The side-effect tools in every worker, and recovery without `chatq beat` (each worker sweeps)."""


@dataclass(frozen=True, kw_only=True)
class Case:
    """One submitted turn of a scenario."""

    turn_id: uuid.UUID
    """The turn."""
    framework: str
    """Its session's agent framework."""
    key: str
    """The key of its stub directives (its requests are those that carry it)."""
    path: Path
    """The file its side-effect tool appends to (same length for every case: same token usage)."""


def submit_rounds(framework: str, tmp: Path, *, hold_at: int = NEVER, fail_at: int = NEVER, hold: float = 0) -> Case:
    """A turn of ROUNDS rounds of the non-repeatable side-effect tool; its `hold_at`-th model request
    waits `hold` seconds before answering, its `fail_at`-th fails with HTTP 500."""
    key, path = uuid.uuid4().hex, tmp / uuid.uuid4().hex[:12] / "out.txt"
    path.parent.mkdir(parents=True)
    content = (
        f'work [rounds: {ROUNDS} {EFFECT} {{"path": "{path}"}}] '
        f"[sleep-at: {key} {hold_at} {hold:g}] [fail-at: {key} {fail_at}]"
    )
    session_id = create_session(framework=framework, model=STUB_MODEL, metadata={"tools": [EFFECT]})
    return Case(turn_id=submit_turn(session_id, content).turn_id, framework=framework, key=key, path=path)


def submit_call(framework: str, tool: str, tmp: Path, *, hold: float) -> Case:
    """A turn whose one call of `tool` waits `hold` seconds after its write (the first time)."""
    key, path = uuid.uuid4().hex, tmp / uuid.uuid4().hex[:12] / "out.txt"
    path.parent.mkdir(parents=True)
    content = f'do it [tool: {tool} {{"path": "{path}", "sleep": {hold:g}}}] #{key}'
    session_id = create_session(framework=framework, model=STUB_MODEL, metadata={"tools": [tool]})
    return Case(turn_id=submit_turn(session_id, content).turn_id, framework=framework, key=key, path=path)


def requests_of(stub: OpenAIStub, case: Case) -> list[dict[str, Any]]:
    """The model requests the case's turn made (in every attempt), oldest first."""
    return [body for body in stub.requests if case.key in json.dumps(body.get("messages"))]


def wait_until(condition: Callable[[], bool], what: str, *, timeout: float, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout:.0f}s\n{logs()}")
        time.sleep(0.05)


class Relay:
    """The scenarios' workers: one takes the new turns (`victim`); a fault hands them to its `successor`.

    Every worker start costs seconds on a small machine: the successor of one scenario is the
    victim of the next, and each is launched while the victim's turns are still on their way.
    """

    def __init__(self, pool: Workers) -> None:
        self.pool = pool
        self._current: Worker | None = None

    def victim(self) -> Worker:
        """The one worker running (started if there is none): every turn submitted now lands on it."""
        if self._current is None or not self._current.alive:
            self._current = self.pool.one(concurrency=SLOTS, env=PLUGIN_ENV)
        assert self.pool.alive == [self._current], "another worker would take some of the turns"
        return self._current

    def successor(self, cases: Mapping[str, Case]) -> Worker:
        """Launch the next worker once the victim has claimed every case (not before: it would take some)."""
        victim = self.victim()
        wait_until(
            lambda: all(
                row.status.value == "running" and (row.worker or "").startswith(victim.hostname_prefix)
                for row in load_turns(case.turn_id for case in cases.values()).values()
            ),
            "the victim did not claim every turn",
            timeout=30,
            logs=self.pool.logs,
        )
        return self.pool.launch(concurrency=SLOTS, env=PLUGIN_ENV)

    def hand_over(self, successor: Worker) -> None:
        """From now on the successor takes the new turns (the victim is gone or about to go)."""
        self._current = successor


def shape(messages: list[ChatMessage], path: Path) -> list[tuple[Any, ...]]:
    """What two runs of a turn must agree on: roles, texts, the tools called and their arguments
    (with the case's file named alike), whether a message answers a call (ids differ per run)."""
    return [
        (
            m.role,
            m.content,
            [(c["name"], json.dumps(c["args"]).replace(str(path), "PATH")) for c in m.tool_calls or ()],
            m.tool_call_id is not None,
        )
        for m in messages
    ]


def usage(row: Turn) -> tuple[int, int, int]:
    return (row.prompt_tokens, row.completion_tokens, row.total_tokens)


def assert_resumed(case: Case, clean: Case, stub: OpenAIStub, redis_url: str, *, attempts: int) -> list[dict[str, Any]]:
    """The case's turn was interrupted in its IN_FLIGHT-th model request and resumed after its four
    finished steps: each side effect once, one model request more than the fault-free `clean`
    run, the same stored messages and usage, one `retry` with `resumed_after`. Returns the events."""
    rows = load_turns([case.turn_id, clean.turn_id])
    row, clean_row = rows[case.turn_id], rows[clean.turn_id]
    assert row.status.value == "succeeded", row.error
    assert row.attempts == attempts

    # The side-effect tool ran exactly ROUNDS times, each call under its own key.
    written = lines(case.path)
    assert len(written) == ROUNDS and len(set(written)) == ROUNDS, written
    assert all(line.startswith(f"{case.turn_id}:call_") for line in written)

    # One model request more than an uninterrupted run: the one in flight, sent again as it was.
    requests, clean_requests = requests_of(stub, case), requests_of(stub, clean)
    assert len(clean_requests) == ROUNDS + 1
    assert len(requests) == len(clean_requests) + 1
    assert requests[IN_FLIGHT]["messages"] == requests[IN_FLIGHT - 1]["messages"]

    # Stored: what the fault-free run stored, each message once, in order, call ids intact.
    stored, expected = turn_messages(case.turn_id)[1:], turn_messages(clean.turn_id)[1:]
    assert shape(stored, case.path) == shape(expected, clean.path)
    assert stored[-1].content == f"Done after {ROUNDS} rounds: line {ROUNDS}"
    for call, result in zip(stored[0:-1:2], stored[1:-1:2], strict=True):
        assert call.tool_calls is not None and result.tool_call_id == call.tool_calls[0]["id"]
    assert [f"{case.turn_id}:{m.tool_call_id}" for m in stored if m.role == "tool"] == written
    assert usage(row) == usage(clean_row)

    # The journal: each round once (a model step, a call started, its result).
    steps = turn_report(case.turn_id)["steps"]
    assert [s["kind"] for s in steps] == ["model", "tool_started", "tool_result"] * ROUNDS

    # The stream: one `retry` saying where the next attempt resumes, then only new events.
    events = replay_events(redis_url, case.turn_id)
    types = [e["type"] for e in events]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert types.count("retry") == 1 and types.count("final") == 1 and types[-1] == "final", types
    retry = types.index("retry")
    assert events[retry]["resumed_after"] == 2 * (IN_FLIGHT - 1)
    before = [e["tool"]["id"] for e in events[:retry] if e["type"] == "tool" and e["tool"]["status"] == "started"]
    after = [e["tool"]["id"] for e in events[retry:] if e["type"] == "tool" and e["tool"]["status"] == "started"]
    assert len(before) == IN_FLIGHT - 1 and len(after) == ROUNDS - IN_FLIGHT + 1 and not set(before) & set(after)
    assert [m["content"] for m in events[-1]["messages"]] == [m.content for m in stored]
    return events


def assert_unknown_outcome(case: Case, tool: str, redis_url: str) -> None:
    """The case's call of a tool not safe to repeat was cut off mid-call: the next attempt did not
    run it again and failed the turn naming the call (docs/contract.md, "Durable steps")."""
    row = load_turns([case.turn_id])[case.turn_id]
    written = lines(case.path)
    assert len(written) == 1, written  # the side effect happened once, and was not repeated
    call_id = written[0].removeprefix(f"{case.turn_id}:")
    assert row.status.value == "failed"
    assert row.error is not None and call_id in row.error and tool in row.error and "unknown" in row.error
    assert [m.role for m in turn_messages(case.turn_id)] == ["user"]
    events = replay_events(redis_url, case.turn_id)
    types = [e["type"] for e in events]
    assert types.count("retry") == 1 and types[-1] == "error" and "final" not in types, types
    assert events[types.index("retry")]["resumed_after"] == 1  # the model step that asked for the call
    assert call_id in events[-1]["error"]
    steps = [(s["kind"], s["call_id"]) for s in turn_report(case.turn_id)["steps"]]
    assert steps == [("model", None), ("tool_started", call_id)]


def assert_repeated(case: Case, redis_url: str) -> None:
    """The case's call of a repeatable tool was cut off mid-call: the next attempt ran it again under
    the same idempotency key, and the turn stored its messages once."""
    row = load_turns([case.turn_id])[case.turn_id]
    assert row.status.value == "succeeded", row.error
    written = lines(case.path)
    assert len(written) == 2 and written[0] == written[1], written  # the same key both times
    call_id = written[0].removeprefix(f"{case.turn_id}:")
    stored = [(m.role, m.content, m.tool_call_id) for m in turn_messages(case.turn_id)]
    assert [role for role, _, _ in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[2] == ("tool", "line 2", call_id) and stored[3][1] == "The answer is line 2."
    events = replay_events(redis_url, case.turn_id)
    types = [e["type"] for e in events]
    assert types.count("retry") == 1 and types.count("final") == 1 and types[-1] == "final", types
    steps = [(s["kind"], s["call_id"]) for s in turn_report(case.turn_id)["steps"]]
    assert steps == [("model", None), ("tool_started", call_id), ("tool_result", call_id)]
