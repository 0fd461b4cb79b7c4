"""The benchmarks' OpenAI-compatible server: tests/support/openai_stub.py plus what benchmarks need.

It runs as its own process (`python -m bench.stub`), so its CPU never counts as chatq's, and adds:

- `[stamps: N]`: the reply is N chunks whose text is each chunk's send time (`time.time()`, then a
  space), so a subscriber of chatq's stream events can compute chunk -> subscriber latency;
- a listen backlog of 1024 (the stdlib default of 5 drops SYNs when 200 turns connect at once,
  which would show up as a 1 s client retry that is the stub's fault, not chatq's);
- `GET /_stats` -> `{"active", "peak", "requests"}` (concurrent requests now, their peak, total) and
  `DELETE /_stats` to reset the peak and the total;
- `[mark: KEY]`: the arrival time (`time.time()`, as soon as the body is read) of every request
  carrying it is kept; `GET /_marks` -> `{KEY: [times]}` (bench/approvals.py times a turn's model
  requests with it).

Every other directive (`[sleep: S]`, `[slow: S]`, `[words: N]`, ...) behaves as in the test stub.
"""

from __future__ import annotations

import json
import time
import uuid
from http.server import ThreadingHTTPServer
from typing import Any

from tests.support.openai_stub import OpenAIStub, Reply, Script, _completion, _Handler
from tests.support.openai_stub import main as stub_main

__all__ = ["BenchStub", "main"]


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024


class BenchStub(OpenAIStub):
    """OpenAIStub with concurrency counters and the `[stamps: N]` directive."""

    server_class = _Server

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.active = 0
        self.peak = 0
        self.total = 0
        self.marks: dict[str, list[float]] = {}

    def handler_base(self) -> type[_Handler]:
        return _BenchHandler

    def record(self, body: dict[str, Any]) -> None:
        pass  # a benchmark sends thousands of requests: keep no bodies

    def record_reply(self, status: int, reply: Reply | None, generation: int) -> None:
        pass

    def enter(self) -> None:
        with self._lock:
            self.active += 1
            self.total += 1
            self.peak = max(self.peak, self.active)

    def leave(self) -> None:
        with self._lock:
            self.active -= 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"active": self.active, "peak": self.peak, "requests": self.total}

    def mark(self, key: str, at: float) -> None:
        with self._lock:
            self.marks.setdefault(key, []).append(at)

    def marked(self) -> dict[str, list[float]]:
        with self._lock:
            return {key: list(times) for key, times in self.marks.items()}

    def reset_stats(self) -> None:
        with self._lock:
            self.peak = self.active
            self.total = 0


class _BenchHandler(_Handler):
    owner: BenchStub  # type: ignore[assignment]

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/_stats":
            self._json(200, self.owner.stats())
        elif self.path.rstrip("/") == "/_marks":
            self._json(200, self.owner.marked())
        else:
            super().do_GET()

    def do_DELETE(self) -> None:
        if self.path.rstrip("/") == "/_stats":
            self.owner.reset_stats()
            self._json(200, {"reset": True})
        else:
            super().do_DELETE()

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            super().do_POST()
            return
        self.owner.enter()
        try:
            self._post()
        finally:
            self.owner.leave()

    def _post(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError):
            self._json(400, {"error": {"message": "invalid JSON body"}})
            return
        arrived = time.time()
        owner = self.owner
        messages = body.get("messages") or []
        script = Script.parse(messages)
        if script.directives.get("mark"):
            owner.mark(script.directives["mark"], arrived)
        owner.wait(owner.latency + script.seconds("sleep"))
        interval = max(owner.chunk_interval, script.seconds("slow"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            if "stamps" in script.directives:
                count = int(script.directives["stamps"]) if script.directives["stamps"].isdigit() else 1
                self._stamps(body, count, interval, include_usage)
                return
            reply = owner.reply_for(messages, script)
            if body.get("stream"):
                self._stream(body, reply, interval, include_usage)
            else:
                self._json(200, _completion(body, reply))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _stamps(self, body: dict[str, Any], count: int, interval: float, include_usage: bool) -> None:
        """Stream `count` chunks, each carrying the time it was written to the socket."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        cid, created, model = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time()), str(body.get("model"))

        def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
            chunk.update(choices=choices, **extra)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for i in range(count):
            if i:
                self.owner.wait(interval)
            send([{"index": 0, "delta": {"content": f"{time.time():.6f} "}, "finish_reason": None}])
        send([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if include_usage:
            send([], usage={"prompt_tokens": 10, "completion_tokens": count, "total_tokens": 10 + count})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main(argv: list[str] | None = None) -> None:
    stub_main(argv, stub_class=BenchStub)


if __name__ == "__main__":
    main()
