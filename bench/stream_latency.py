"""Target 3, stream latency: model chunk -> pub/sub subscriber, against raw redis-py publish -> subscribe.

Chatq: the stub streams `[stamps: N]` replies whose chunk texts are their own send times
(`time.time()` just before the socket write), `[slow: 0.01]` apart; one turn at a time, each in a
new session, on a `chatq worker` with CHATQ_TEXT_COALESCE_MS=0. A subscriber thread in this
process (redis-py, `psubscribe chatq:session:*`) stamps each `text` event on receipt; latency =
receipt - send time of every chunk in the event. Same machine, same clock.

Baseline: a separate process publishes the same number of event-sized JSON messages, each with
`time.time()` taken just before `PUBLISH`, at the same interval, to a channel the same subscriber
code reads. Target: chatq p50 <= 2x, p99 <= 3x the baseline's.

Coalescing (informational): messages per turn for a fast model (`[words: 200]`, 1 ms between
chunks) with CHATQ_TEXT_COALESCE_MS=0 and =20 (a second worker), and the chunk latency with the
20 ms window on a model 10 ms and 50 ms between chunks (a window is a promise: held text should
leave within it).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from bench.common import (
    Block,
    EventCapture,
    Stub,
    chatq_worker,
    create_sessions,
    isolated_services,
    log,
    median,
    new_session_info,
    percentile,
    run_warmup,
    use_stub,
)

MODEL = "gpt-4o-mini"
PUBLISHER = """
import json, sys, time, redis
url, channel, count, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
client = redis.Redis.from_url(url)
client.ping()
time.sleep(0.3)
for i in range(count):
    event = {"v": 1, "type": "text", "session_id": "s" * 36, "turn_id": "t" * 36, "attempt": 1, "seq": i,
             "ts": round(time.time(), 3)}
    event["text"] = f"{time.time():.6f} "
    client.publish(channel, json.dumps(event, separators=(",", ":")))
    time.sleep(interval)
"""


def _text_latencies(capture: EventCapture, turn_ids: list[Any]) -> tuple[list[float], list[int]]:
    """Per-chunk latencies (ms) and text events per turn."""
    latencies: list[float] = []
    per_turn: list[int] = []
    for turn in turn_ids:
        events = [(t, e) for t, e in capture.of(turn) if e.get("type") == "text"]
        per_turn.append(len(events))
        for received, event in events:
            for stamp in str(event.get("text", "")).split():
                if stamp[:1].isdigit():  # [stamps: N] replies; [words: N] ones only count messages
                    latencies.append((received - float(stamp)) * 1000)
    return latencies, per_turn


def _chatq_turns(capture: EventCapture, content: str, turns: int, timeout: float = 30) -> list[Any]:
    from worker.producer import submit_turn

    ids = []
    for session_id in create_sessions(turns, model=MODEL):
        turn_id = submit_turn(session_id, content).turn_id
        if not capture.wait(turn_id, timeout):
            raise RuntimeError(f"turn {turn_id} did not finish in {timeout} s")
        ids.append(turn_id)
    return ids


def _in_process_handler(chunks: int, interval: float, turns: int) -> list[float]:
    """Chunk -> StreamEvent latency (ms) of the handler alone, called in this process: the part of
    the chatq figure that LangGraph/LangChain/openai add before the worker publishes anything."""

    from handlers import get_agent_handler
    from handlers.base import StreamEventKind

    out: list[float] = []
    for _ in range(turns):
        info = new_session_info(MODEL)
        handler = get_agent_handler(info)
        for event in handler.stream_turn(handler.prepare(f"[stamps: {chunks}] [slow: {interval:g}]")):
            now = time.time()
            if event.kind == StreamEventKind.TEXT:
                out.extend((now - float(s)) * 1000 for s in event.text.split() if s[:1].isdigit())
    return out


def _raw_baseline(count: int, interval: float) -> list[float]:
    import os

    channel = "bench:raw"
    with EventCapture(channel, raw=True) as capture:
        subprocess.run(
            [sys.executable, "-c", PUBLISHER, os.environ["REDIS_URL"], channel, str(count), str(interval)],
            check=True,
            timeout=120,
        )
        time.sleep(0.3)
    out = []
    for received, data in capture.received:
        import json

        out.append((received - float(json.loads(data)["text"])) * 1000)
    return out


def run(quick: bool = False) -> list[Block]:
    turns, chunks, interval = (5, 30, 0.01) if quick else (15, 40, 0.01)
    with isolated_services("stream") as _env, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        with EventCapture() as capture:
            with chatq_worker(env={"CHATQ_TEXT_COALESCE_MS": "0"}) as worker:
                worker.start()
                run_warmup(capture, [MODEL])
                log(f"coalescing off: {turns} turns x {chunks} stamped chunks, {interval * 1000:g} ms apart")
                ids = _chatq_turns(capture, f"[stamps: {chunks}] [slow: {interval:g}]", turns)
                chatq_ms, _ = _text_latencies(capture, ids)
                log("coalescing off: fast model, [words: 200] 1 ms apart")
                fast_off = _text_latencies(capture, _chatq_turns(capture, "[words: 200] [slow: 0.001]", 5))[1]
            with chatq_worker(env={"CHATQ_TEXT_COALESCE_MS": "20"}) as worker:
                worker.start()
                run_warmup(capture, [MODEL])
                log("coalescing 20 ms: fast model, [words: 200] 1 ms apart")
                fast_on = _text_latencies(capture, _chatq_turns(capture, "[words: 200] [slow: 0.001]", 5))[1]
                log("coalescing 20 ms: stamped chunks 10 ms and 50 ms apart")
                held_10 = _text_latencies(capture, _chatq_turns(capture, "[stamps: 30] [slow: 0.01]", 4))[0]
                held_50 = _text_latencies(capture, _chatq_turns(capture, "[stamps: 12] [slow: 0.05]", 4))[0]
        log(f"raw redis-py: {turns * chunks} messages {interval * 1000:g} ms apart")
        raw_ms = _raw_baseline(turns * chunks, interval)
        log("in-process handler: chunk -> StreamEvent")
        handler_ms = _in_process_handler(chunks, interval, max(turns // 4, 2))

    details = {
        "samples": f"chatq {len(chatq_ms)} chunks, raw {len(raw_ms)} messages",
        "chatq": f"p50 {percentile(chatq_ms, 50):.2f} ms, p90 {percentile(chatq_ms, 90):.2f}, "
        f"p99 {percentile(chatq_ms, 99):.2f}, max {max(chatq_ms):.2f}",
        "raw": f"p50 {percentile(raw_ms, 50):.3f} ms, p90 {percentile(raw_ms, 90):.3f}, "
        f"p99 {percentile(raw_ms, 99):.3f}, max {max(raw_ms):.3f}",
        "handler": "in-process handler alone (chunk -> StreamEvent, no worker): "
        f"p50 {percentile(handler_ms, 50):.2f} ms, "
        f"p90 {percentile(handler_ms, 90):.2f}, p99 {percentile(handler_ms, 99):.2f}",
    }
    bound = 20.0 + percentile(chatq_ms, 99)
    return [
        Block(
            name="stream_latency.p50",
            target="model chunk -> subscriber p50 <= 2x raw redis-py publish -> subscribe p50",
            figure=percentile(chatq_ms, 50),
            baseline=percentile(raw_ms, 50),
            baseline_label="raw redis-py publish -> subscribe",
            unit="ms",
            limit=2.0,
            details=details,
        ),
        Block(
            name="stream_latency.p99",
            target="model chunk -> subscriber p99 <= 3x raw redis-py p99",
            figure=percentile(chatq_ms, 99),
            baseline=percentile(raw_ms, 99),
            baseline_label="raw redis-py publish -> subscribe",
            unit="ms",
            limit=3.0,
        ),
        Block(
            name="stream_latency.coalesce_messages",
            target="text messages per turn, fast model (200 chunks 1 ms apart): 20 ms window vs none (reported)",
            figure=median(fast_on),
            baseline=median(fast_off),
            baseline_label="CHATQ_TEXT_COALESCE_MS=0",
            unit="msgs",
            limit=None,
            details={"per turn": f"window 20 ms: {fast_on}; window 0: {fast_off}"},
        ),
        Block(
            name="stream_latency.coalesce_hold",
            target="chunk latency p99 with a 20 ms window, model 50 ms between chunks, vs window + p99 without "
            "coalescing (held text should leave within the window; reported)",
            figure=percentile(held_50, 99),
            baseline=bound,
            baseline_label="20 ms + p99 with window 0",
            unit="ms",
            limit=None,
            details={
                "10 ms gap": f"p50 {percentile(held_10, 50):.2f} ms, p99 {percentile(held_10, 99):.2f} ms",
                "50 ms gap": f"p50 {percentile(held_50, 50):.2f} ms, p99 {percentile(held_50, 99):.2f} ms, "
                f"max {max(held_50):.2f} ms",
            },
        ),
    ]
