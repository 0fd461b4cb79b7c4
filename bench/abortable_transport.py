"""`python -m bench.abortable_transport [--requests N] [--words W] [--rounds R]`: what the abortable
model transport (handlers/abortable_http.py) costs per streamed request, against the openai SDK's own.

The same streamed chat completions (W words, one chunk each) go to the benchmark stub (its own
process, so its CPU is not counted) through two clients built alike: the SDK's stock httpx2 client
and `model_http_client()`, under a turn's abort signal as the worker runs them. Rounds alternate
so drift on a shared machine hits both; the figure is this process's CPU per request (and wall
time), medians over the rounds, with the ratio of the two. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import openai

from bench.common import Stub
from handlers.abort import AbortSignal, abortable
from handlers.chat_models.http import model_http_client


def _stream(client: openai.OpenAI, words: int) -> int:
    chunks = 0
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"go [words: {words}]"}],
        stream=True,
    )
    for _chunk in stream:
        chunks += 1
    return chunks


def _round(client: openai.OpenAI, requests: int, words: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per request over `requests` streamed requests."""
    cpu, wall = time.process_time(), time.perf_counter()
    with abortable(AbortSignal()):
        for _ in range(requests):
            _stream(client, words)
    return (time.process_time() - cpu) / requests, (time.perf_counter() - wall) / requests


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--words", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    stub = Stub().start()
    try:
        clients = {
            "stock": openai.OpenAI(base_url=stub.base_url, api_key="x", max_retries=0, timeout=30),
            "abortable": openai.OpenAI(
                base_url=stub.base_url, api_key="x", max_retries=0, timeout=30, http_client=model_http_client(30)
            ),
        }
        for client in clients.values():
            _round(client, 20, args.words)  # warm-up: connections, imports, caches
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
        for _ in range(args.rounds):
            for name, client in clients.items():
                figures[name].append(_round(client, args.requests, args.words))
    finally:
        stub.stop()
    result: dict[str, Any] = {}
    for name, rounds in figures.items():
        result[name] = {
            "cpu_us": statistics.median(c for c, _ in rounds) * 1e6,
            "wall_us": statistics.median(w for _, w in rounds) * 1e6,
        }
    result["cpu_ratio"] = result["abortable"]["cpu_us"] / result["stock"]["cpu_us"]
    result["wall_ratio"] = result["abortable"]["wall_us"] / result["stock"]["wall_us"]
    print(
        f"{args.requests} requests x {args.rounds} rounds, {args.words} chunks each: "
        f"stock {result['stock']['cpu_us']:.0f} us CPU / {result['stock']['wall_us']:.0f} us wall per request, "
        f"abortable {result['abortable']['cpu_us']:.0f} us / {result['abortable']['wall_us']:.0f} us "
        f"(CPU x{result['cpu_ratio']:.3f}, wall x{result['wall_ratio']:.3f})"
    )
    return result


if __name__ == "__main__":
    main()
