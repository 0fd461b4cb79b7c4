"""Target 5, history at scale: a turn in a 10,000-message session against one in a 10-message session.

Two sessions are written straight into Postgres with SQLAlchemy core: 5,000 succeeded turns with a
user and an assistant message each (10,000 messages), and 5 such turns (10 messages). Every stored
message is about 550 estimated tokens, so the 10-message session's whole history fits the default
CHATQ_HISTORY_TOKENS (6,000) and the 10,000-message one also sends about 10 messages plus a one-line
summary: the model input is the same size, and what differs is only how much is stored. (With short
messages the big session would send a budget-full history and the comparison would measure the
prompt size, not the session length.)

Turns alternate between the two sessions, one at a time, on a warmed-up `chatq worker` with the stub
answering at once. Figures: end-to-end time per turn (`submit_turn` -> `final` received) p50, and
the worker's CPU per turn (/proc deltas). Also `build_history` timed in this process for both.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.common import (
    Block,
    EventCapture,
    Stub,
    chatq_worker,
    create_sessions,
    isolated_services,
    log,
    percentile,
    proc_cpu,
    run_warmup,
    use_stub,
)

MODEL = "gpt-4o-mini"
WORDS = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "lambda", "zeta")


def _content(seed: int, words: int = 550) -> str:
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] for i in range(words))


def _fill(session_id: uuid.UUID, turns: int) -> None:
    """Insert `turns` succeeded turns with a user and an assistant message each, in bulk."""
    from sqlalchemy import insert, update

    from models.db import session_scope
    from models.tables import MESSAGE_POSITION_STRIDE, ChatMessage, ChatSession, Turn, TurnStatus

    batch = 1000
    for start in range(0, turns, batch):
        ids = [uuid.uuid4() for _ in range(start, min(start + batch, turns))]
        with session_scope() as db:
            db.execute(
                insert(Turn),
                [
                    {
                        "id": turn_id,
                        "session_id": session_id,
                        "position": start + i,
                        "status": TurnStatus.SUCCEEDED,
                        "queue": "chatq",
                        "attempts": 1,
                        "prompt_tokens": 600,
                        "completion_tokens": 550,
                        "total_tokens": 1150,
                    }
                    for i, turn_id in enumerate(ids)
                ],
            )
            rows: list[dict[str, Any]] = []
            for i, turn_id in enumerate(ids):
                position = (start + i) * MESSAGE_POSITION_STRIDE
                rows.append(
                    {
                        "session_id": session_id,
                        "turn_id": turn_id,
                        "position": position,
                        "role": "user",
                        "content": _content(start + i),
                    }
                )
                rows.append(
                    {
                        "session_id": session_id,
                        "turn_id": turn_id,
                        "position": position + 1,
                        "role": "assistant",
                        "content": _content(start + i + 3),
                    }
                )
            db.execute(insert(ChatMessage), rows)
    with session_scope() as db:
        db.execute(update(ChatSession).where(ChatSession.id == session_id).values(next_turn_position=turns))
        # The running history totals complete_turn keeps, as if these turns had run.
        from worker.store.turns import recount_history_totals

        recount_history_totals(db, session_id)
    with session_scope() as db:
        from sqlalchemy import text

        db.execute(text("ANALYZE turns"))
        db.execute(text("ANALYZE chat_messages"))


def _history_timing(session_id: uuid.UUID, reps: int) -> tuple[float, int, int]:
    """build_history (the store's rows, trimmed) in this process: p50 ms, messages sent, messages omitted."""
    from handlers.history import History, trim_history
    from models.history import session_history

    def build_history() -> History:
        with session_history(session_id) as pages:
            return trim_history(pages, "how are you")

    history = build_history()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        build_history()
        times.append((time.perf_counter() - t0) * 1000)
    return percentile(times, 50), len(history.messages), history.omitted


def run(quick: bool = False) -> list[Block]:
    rounds = 6 if quick else 20
    with isolated_services("history") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        big, small = create_sessions(2, model=MODEL)
        log("writing 10,000 messages (5,000 turns) and 10 messages (5 turns)")
        t0 = time.monotonic()
        _fill(big, 5000)
        _fill(small, 5)
        log(f"written in {time.monotonic() - t0:.1f} s")
        hist = {name: _history_timing(s, 10 if quick else 30) for name, s in (("big", big), ("small", small))}
        from worker.producer import submit_turn

        e2e: dict[str, list[float]] = {"big": [], "small": []}
        cpu: dict[str, float] = {"big": 0.0, "small": 0.0}
        with EventCapture() as capture, chatq_worker() as worker:
            worker.start()
            run_warmup(capture, [MODEL])
            log(f"{rounds} turns in each session, alternating")
            for i in range(rounds + 2):
                for name, session_id in (("big", big), ("small", small)):
                    c0 = proc_cpu(worker.pid)
                    t0 = time.time()
                    turn_id = submit_turn(session_id, f"how are you {i}").turn_id
                    if not capture.wait(turn_id, 30):
                        raise RuntimeError(f"turn {turn_id} did not finish")
                    final = [e for _, e in capture.of(turn_id) if e["type"] in ("final", "error")]
                    if final[0]["type"] != "final":
                        raise RuntimeError(f"turn {turn_id} failed: {final[0].get('error')}")
                    received = capture.of(turn_id)[-1][0]
                    time.sleep(0.2)  # let the worker finish the turn's tail (ack, task events, kick_next)
                    if i >= 2:  # the first two rounds warm this session's plan and pages
                        e2e[name].append((received - t0) * 1000)
                        cpu[name] += proc_cpu(worker.pid) - c0
    details = {
        "end-to-end": f"10k: p50 {percentile(e2e['big'], 50):.1f} ms p90 {percentile(e2e['big'], 90):.1f}; "
        f"10: p50 {percentile(e2e['small'], 50):.1f} ms p90 {percentile(e2e['small'], 90):.1f} ({rounds} turns each)",
        "history": f"build_history in-process p50: 10k {hist['big'][0]:.2f} ms ({hist['big'][1]} sent, "
        f"{hist['big'][2]} omitted), 10: {hist['small'][0]:.2f} ms ({hist['small'][1]} sent)",
    }
    cpu_big, cpu_small = cpu["big"] / rounds * 1000, cpu["small"] / rounds * 1000
    return [
        Block(
            name="history_scale.e2e",
            target="turn in a 10,000-message session, end-to-end p50 <= 1.2x a 10-message session's",
            figure=percentile(e2e["big"], 50),
            baseline=percentile(e2e["small"], 50),
            baseline_label="10-message session, same prompt size",
            unit="ms",
            limit=1.2,
            details=details,
        ),
        Block(
            name="history_scale.worker_cpu",
            target="worker CPU per turn, 10,000-message session vs 10-message session <= 1.2x",
            figure=cpu_big,
            baseline=cpu_small,
            baseline_label="10-message session (10 ms /proc ticks: +-1 ms per turn)",
            unit="ms",
            limit=1.2,
        ),
        Block(
            name="history_scale.build_history",
            target="build_history alone, in-process, 10,000-message vs 10-message session (reported, no limit)",
            figure=hist["big"][0],
            baseline=hist["small"][0],
            baseline_label="10-message session",
            unit="ms",
            limit=None,
        ),
    ]
