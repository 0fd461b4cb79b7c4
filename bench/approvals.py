"""Approvals (issue 29): a person's decision -> the first model request of the resumed turn, against a
fresh submit -> its first model request, in the same run on the same worker.

One `chatq worker` (the project's defaults) and the benchmarks' stub (bench/stub.py, its own
process), which stamps the arrival of every request carrying `[mark: KEY]` with `time.time()` (same
machine, same clock). Each sample, one at a time on an idle worker, alternating the two adapters
(`plain_openai`, `langgraph`) and the two kinds so a neighbour's load weighs on both alike:

- resume: a turn whose model calls `calculator`, which its session's `approval` names, pauses (its
  `approval_required` event seen); then latency = the arrival of its second model request minus
  `time.time()` just before `decide_tool_call(approve=True)`. In between: the decision's transaction,
  the send, the claim, the journal read, the approved call (the calculator: microseconds), the request;
- fresh: the same turn in a session without approval; latency = the arrival of its first model
  request minus `time.time()` just before `submit_turn`.

Target: resume p50 <= 1.5x fresh p50 (a resume is a dispatch plus its journal); p99 is reported
beside its baseline, informational. The machine's load average is recorded before and after.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections import defaultdict
from typing import Any

from bench.common import (
    Block,
    EventCapture,
    Stub,
    chatq_worker,
    isolated_services,
    log,
    percentile,
    run_warmup,
    use_stub,
)

MODEL = "gpt-4o-mini"
FRAMEWORKS = ("plain_openai", "langgraph")
IDLE = 0.05
"""Seconds the worker idles before each measured step (as bench/dispatch.py)."""
TIMEOUT = 30.0


def _marks(stub: Stub) -> dict[str, list[float]]:
    with urllib.request.urlopen(stub.base_url.removesuffix("/v1") + "/_marks", timeout=10) as response:
        data: dict[str, list[float]] = json.loads(response.read())
        return data


def _event(capture: EventCapture, turn_id: uuid.UUID, kind: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        found = [event for _, event in capture.of(turn_id) if event.get("type") == kind]
        if found:
            return found[0]
        time.sleep(0.005)
    raise RuntimeError(f"turn {turn_id}: no {kind!r} event in {TIMEOUT:.0f} s")


def _session(framework: str, *, approval: bool) -> uuid.UUID:
    from worker.producer import create_session

    return create_session(
        framework=framework,
        model=MODEL,
        metadata={"tools": ["calculator"]},
        approval=["calculator"] if approval else None,
    )


def _resume(capture: EventCapture, framework: str) -> tuple[str, float]:
    """Pause a turn, then decide: (its key, time.time() just before the decision)."""
    from worker.approvals import decide_tool_call
    from worker.producer import submit_turn

    key = uuid.uuid4().hex
    turn_id = submit_turn(_session(framework, approval=True), f"[mark: {key}] [calc: 6*7]").turn_id
    [call] = _event(capture, turn_id, "approval_required")["calls"]
    time.sleep(IDLE)
    decided_at = time.time()
    decide_tool_call(turn_id, call["id"], approve=True)
    if not capture.wait(turn_id, TIMEOUT):
        raise RuntimeError(f"resumed turn {turn_id} did not finish")
    return key, decided_at


def _fresh(capture: EventCapture, framework: str) -> tuple[str, float]:
    """Submit a turn: (its key, time.time() just before the submit)."""
    from worker.producer import submit_turn

    key = uuid.uuid4().hex
    session_id = _session(framework, approval=False)
    time.sleep(IDLE)
    submitted_at = time.time()
    turn_id = submit_turn(session_id, f"[mark: {key}] [calc: 6*7]").turn_id
    if not capture.wait(turn_id, TIMEOUT):
        raise RuntimeError(f"turn {turn_id} did not finish")
    return key, submitted_at


def _measure(capture: EventCapture, stub: Stub, count: int) -> dict[str, list[float]]:
    """`count` samples of each kind, alternating kinds and adapters; latencies in ms by kind and by kind/adapter."""
    taken: list[tuple[str, str, str, float, int]] = []  # kind, framework, key, t0, which request
    for index in range(count):
        framework = FRAMEWORKS[index % len(FRAMEWORKS)]
        first, second = ("resume", "fresh") if index % 4 < 2 else ("fresh", "resume")
        for kind in (first, second):
            key, t0 = _resume(capture, framework) if kind == "resume" else _fresh(capture, framework)
            taken.append((kind, framework, key, t0, 1 if kind == "resume" else 0))
    marks = _marks(stub)
    out: dict[str, list[float]] = defaultdict(list)
    for kind, framework, key, t0, which in taken:
        arrivals = marks.get(key, [])
        if len(arrivals) <= which:
            raise RuntimeError(f"{kind} turn {key}: {len(arrivals)} model request(s) seen, expected {which + 1}+")
        latency = (arrivals[which] - t0) * 1000
        out[kind].append(latency)
        out[f"{kind}/{framework}"].append(latency)
    return out


def _load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def _spread(values: list[float]) -> str:
    return f"p50 {percentile(values, 50):.2f} ms, p90 {percentile(values, 90):.2f}, p99 {percentile(values, 99):.2f}"


def run(quick: bool = False) -> list[Block]:
    count = 10 if quick else 100
    load_before = _load()
    with isolated_services("approvals"), Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        with EventCapture() as capture, chatq_worker() as worker:
            worker.start()
            run_warmup(capture, [MODEL], turns_each=3)
            _measure(capture, stub, len(FRAMEWORKS) * 2)  # warm: both adapters, both kinds
            log(f"{count} paused turns decided and {count} fresh turns, one at a time, alternating")
            res = _measure(capture, stub, count)
    load = f"1/5/15-min load average {load_before} before, {_load()} after ({os.cpu_count()} cores)"
    by_framework = "; ".join(
        f"{kind} {framework}: p50 {percentile(res[f'{kind}/{framework}'], 50):.2f} ms"
        for framework in FRAMEWORKS
        for kind in ("resume", "fresh")
    )
    details = {
        "resume": _spread(res["resume"]) + " (decision -> first model request after the resume)",
        "fresh": _spread(res["fresh"]) + " (submit_turn -> first model request)",
        "adapters": by_framework,
        "load": load,
    }
    return [
        Block(
            name="approvals.resume_p50",
            target="decision -> first model request after the resume p50 <= 1.5x submit -> first model request p50",
            figure=percentile(res["resume"], 50),
            baseline=percentile(res["fresh"], 50),
            baseline_label="fresh submit -> first model request, same run and worker",
            unit="ms",
            limit=1.5,
            details=details,
        ),
        Block(
            name="approvals.resume_p99",
            target="decision -> first model request after the resume p99, beside a fresh submit's (informational)",
            figure=percentile(res["resume"], 99),
            baseline=percentile(res["fresh"], 99),
            baseline_label="fresh submit -> first model request p99, same run and worker",
            unit="ms",
            limit=None,
            details={"samples": f"{count} of each", "load": load},
        ),
    ]
