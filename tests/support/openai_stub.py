"""A small OpenAI-compatible chat-completions server for tests and benchmarks (stdlib only).

Real clients (langchain-openai, the openai SDK) talk to it over HTTP; nothing is mocked. Its
behaviour is scripted by directives inside the LAST user message, so concurrent tests sharing one
server never interfere:

    (no directive)         reply f"You said: {text}", streamed one word per chunk
    [calc: EXPR]           ask for calculator {"expression": EXPR}; after the tool result answer
                           f"The answer is {result}."
    [tool: NAME {json}]    ask for tool NAME with those args; likewise answered after its result
                           (only a result of the stub's own call counts: a tool result the client
                           added by itself, such as chatq's knowledge-base retrieval, does not)
    [quote]                after a tool result, reply f"From the sources: {result}"
    [answer: TEXT]         reply TEXT
    [answer-json: "..."]   reply the JSON string's value (escapes such as \\u0000 or a lone \\ud800 give
                           text no user message can carry)
    [unauthorized]         HTTP 401 whose message echoes the API key the client sent, as some
                           OpenAI-compatible servers do
    [loop: EXPR]           ask for calculator every time, even after results (recursion limits)
    [rounds: N NAME {json}] ask for tool NAME with those args (one call a round) until N results of its
                           own calls follow the last user message, then answer f"Done after N rounds: {result}"
    [fail-at: KEY N]       HTTP 500 only the Nth time KEY is seen (server-wide): a fault mid-turn
    [fail]                 HTTP 500, always
    [fail-once: KEY]       HTTP 500 the first time KEY is seen (server-wide), normal afterwards
    [fail-times: KEY N]    HTTP 500 the first N times KEY is seen
    [ratelimit-times: KEY N]  HTTP 429 with `retry-after-ms: 200` the first N times KEY is seen
    [overloaded-times: KEY N] HTTP 503 with `retry-after: 1` the first N times KEY is seen
    [sleep: S]             wait S seconds before the first byte (a stall)
    [sleep-once: KEY S]    wait S seconds before the first byte the first time KEY is seen (server-wide)
    [sleep-at: KEY N S]    wait S seconds before the first byte only the Nth time KEY is seen (server-wide):
                           a request of a turn held in flight (a fault lands while it waits)
    [slow: S]              wait S seconds between streamed chunks
    [empty]                empty content and no tool calls
    [words: N]             reply "w1 w2 ... wN"

`text` is the last user message with the directives removed. Usage is reported (words of the
prompt, words of the reply); streamed usage comes in a last chunk when stream_options.include_usage.

With `limits` (`tests.support.provider_limits.ProviderLimits`) the server as a whole behaves like a
provider: requests and tokens per minute (or a fixed window) and a concurrency cap, answered with
429 and OpenAI's rate-limit headers; GET /_provider returns its counts, DELETE /_provider refills it.

Run standalone: `python -m tests.support.openai_stub --port 8089 [--latency S] [--chunk-interval S]
[--rpm N --tpm N --max-concurrent N --window S --record off]` prints the base URL; GET /_requests returns the
recorded request bodies, DELETE /_requests clears them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.support.provider_limits import ProviderLimits, Refusal

__all__ = ["OpenAIStub", "main"]

_DIRECTIVE = re.compile(r"\[(?P<name>[a-z][a-z-]*)(?::\s*(?P<arg>[^\]]*))?\]")


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


@dataclass
class Script:
    """What the last user message asks the stub to do."""

    text: str = ""
    directives: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, messages: list[dict[str, Any]]) -> Script:
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        raw = message_text(last_user) if last_user else ""
        directives = {m["name"]: (m["arg"] or "").strip() for m in _DIRECTIVE.finditer(raw)}
        text = " ".join(_DIRECTIVE.sub(" ", raw).split())
        return cls(text=text, directives=directives)

    def seconds(self, name: str) -> float:
        try:
            return max(float(self.directives.get(name, 0) or 0), 0.0)
        except ValueError:
            return 0.0


@dataclass
class Reply:
    """One completion the stub sends."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


class OpenAIStub:
    """The server: start()/stop() or use as a context manager; `base_url` ends in /v1."""

    server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer
    """The HTTP server class (the benchmarks' stub listens with a deeper backlog)."""

    def handler_base(self) -> type[_Handler]:
        """The request handler class to serve with (a subclass may add directives)."""
        return _Handler

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        chunk_interval: float = 0.0,
        limits: ProviderLimits | None = None,
        keep_bodies: bool = True,
    ) -> None:
        self.limits = limits
        """Server-wide provider limits (None: every request is answered)."""
        self.keep_bodies = keep_bodies
        """False: request bodies and replies are not recorded (long benchmark runs)."""
        self.latency = latency
        """Seconds to wait before the first byte of every response."""
        self.chunk_interval = chunk_interval
        """Seconds to wait between streamed chunks."""
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._replies: list[dict[str, Any]] = []
        self.generation = 0
        """Bumped by clear(): a request that came before it is answered but its reply not recorded."""
        self._seen: dict[str, int] = {}
        self._issued: set[str] = set()
        """Ids of the tool calls this server asked for."""
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> OpenAIStub:
        if self._server is not None:
            return self
        stub = self

        class Handler(self.handler_base()):  # type: ignore[misc]
            owner = stub

        server = self.server_class((self._host, self._port), Handler)
        server.daemon_threads = True
        server.block_on_close = False  # a handler sleeping on [sleep: S] must not hold up stop()
        self._stopping.clear()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the stub is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    # --- what it saw -------------------------------------------------------------------------

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies received on /v1/chat/completions, oldest first (a copy). A body may lack
        `messages` (tests of malformed requests post such bodies to the shared stub): read it with
        `.get("messages", [])`."""
        with self._lock:
            return list(self._requests)

    @property
    def replies(self) -> list[dict[str, Any]]:
        """What was answered to each request: {"status", "content", "tool_calls", "usage"}."""
        with self._lock:
            return list(self._replies)

    def clear(self) -> None:
        """Forget recorded requests and replies (fail-once memory is kept: keys are unique per test)."""
        with self._lock:
            self._requests.clear()
            self._replies.clear()
            self.generation += 1

    # --- behaviour ---------------------------------------------------------------------------

    def record(self, body: dict[str, Any]) -> None:
        if not self.keep_bodies:
            return
        with self._lock:
            self._requests.append(body)

    def record_reply(self, status: int, reply: Reply | None, generation: int) -> None:
        """Record what a request got, unless clear() ran since it arrived (an earlier test's request
        that outlived its client, e.g. a `[sleep: S]` past a timeout, must not count in this one)."""
        if not self.keep_bodies:
            return
        entry: dict[str, Any] = {"status": status, "content": None, "tool_calls": None, "usage": None}
        if reply is not None:
            entry.update(content=reply.content, tool_calls=reply.tool_calls or None, usage=reply.usage)
        with self._lock:
            if generation == self.generation:
                self._replies.append(entry)

    def scripted_refusal(self, script: Script) -> Refusal | None:
        """A 429 or 503 that the script asks for (`[ratelimit-times: KEY N]`, `[overloaded-times: KEY N]`)."""
        for name, refusal in (
            ("ratelimit-times", Refusal(429, {"retry-after-ms": "200", "retry-after": "1"})),
            ("overloaded-times", Refusal(503, {"retry-after": "1"}, "The server is overloaded")),
        ):
            if name not in script.directives:
                continue
            key, _, count = script.directives[name].rpartition(" ")
            times = int(count) if count.isdigit() else 1
            with self._lock:
                seen = self._seen.get(f"{name}:{key}", 0)
                self._seen[f"{name}:{key}"] = seen + 1
            if seen < times:
                return refusal
        return None

    def sleep_once(self, script: Script) -> float:
        """The `[sleep-once: KEY S]` wait: S seconds the first time KEY is seen, 0 afterwards."""
        key, _, seconds = script.directives.get("sleep-once", "").rpartition(" ")
        if not key:
            return 0.0
        with self._lock:
            seen = self._seen.get(f"sleep-once:{key}", 0)
            self._seen[f"sleep-once:{key}"] = seen + 1
        try:
            return max(float(seconds), 0.0) if seen == 0 else 0.0
        except ValueError:
            return 0.0

    def sleep_at(self, script: Script) -> float:
        """The `[sleep-at: KEY N S]` wait: S seconds the Nth time KEY is seen, 0 otherwise."""
        key, _, rest = script.directives.get("sleep-at", "").partition(" ")
        count, _, seconds = rest.strip().partition(" ")
        if not key or not count.isdigit():
            return 0.0
        with self._lock:
            seen = self._seen.get(f"sleep-at:{key}", 0) + 1
            self._seen[f"sleep-at:{key}"] = seen
        try:
            return max(float(seconds), 0.0) if seen == int(count) else 0.0
        except ValueError:
            return 0.0

    def should_fail(self, script: Script) -> bool:
        if "fail" in script.directives:
            return True
        if "fail-at" in script.directives:
            key, _, count = script.directives["fail-at"].rpartition(" ")
            with self._lock:
                seen = self._seen.get(f"fail-at:{key}", 0) + 1
                self._seen[f"fail-at:{key}"] = seen
            return count.isdigit() and seen == int(count)
        rule = script.directives.get("fail-once")
        times = 1
        if rule is None and "fail-times" in script.directives:
            key, _, count = script.directives["fail-times"].rpartition(" ")
            rule, times = key.strip() or count, int(count) if count.isdigit() else 1
        if rule is None:
            return False
        with self._lock:
            seen = self._seen.get(rule, 0)
            self._seen[rule] = seen + 1
        return seen < times

    def issue(self, call: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._issued.add(call["id"])
        return call

    def answered(self, messages: list[dict[str, Any]], name: str) -> bool:
        """True if the last message is the result of a call of `name` that this stub asked for."""
        last = messages[-1] if messages else {}
        if last.get("role") != "tool":
            return False
        call_id = last.get("tool_call_id")
        with self._lock:
            if call_id not in self._issued:
                return False
        for message in reversed(messages):
            for call in message.get("tool_calls") or ():
                if call.get("id") == call_id:
                    return bool((call.get("function") or {}).get("name") == name)
        return False

    def own_results(self, messages: list[dict[str, Any]]) -> int:
        """Tool results after the last user message that answer calls this stub asked for."""
        start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        with self._lock:
            return sum(
                1 for m in messages[start + 1 :] if m.get("role") == "tool" and m.get("tool_call_id") in self._issued
            )

    def wait(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def reply_for(self, messages: list[dict[str, Any]], script: Script) -> Reply:
        last = messages[-1] if messages else {}
        after_tool = last.get("role") == "tool"
        d = script.directives
        tool_name, _, raw_args = d.get("tool", "").partition(" ")
        reply = Reply()
        if "empty" in d:
            pass
        elif "loop" in d:
            reply.tool_calls = [self.issue(_tool_call("calculator", {"expression": d["loop"] or "1+1"}))]
        elif "rounds" in d:
            count, _, rest = d["rounds"].partition(" ")
            name, _, raw = rest.strip().partition(" ")
            rounds = int(count) if count.isdigit() else 1
            if self.own_results(messages) >= rounds:
                reply.content = f"Done after {rounds} rounds: {message_text(last)}"
            else:
                try:
                    args = json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError:
                    args = {"raw": raw}
                reply.tool_calls = [self.issue(_tool_call(name, args if isinstance(args, dict) else {"value": args}))]
        elif ("calc" in d and self.answered(messages, "calculator")) or (
            "tool" in d and self.answered(messages, tool_name)
        ):
            reply.content = f"The answer is {message_text(last)}."
        elif "calc" in d:
            reply.tool_calls = [self.issue(_tool_call("calculator", {"expression": d["calc"]}))]
        elif "tool" in d:
            try:
                args = json.loads(raw_args) if raw_args.strip() else {}
            except json.JSONDecodeError:
                args = {"raw": raw_args}
            reply.tool_calls = [self.issue(_tool_call(tool_name, args if isinstance(args, dict) else {"value": args}))]
        elif "words" in d:
            count = int(d["words"]) if d["words"].isdigit() else 1
            reply.content = " ".join(f"w{i}" for i in range(1, count + 1))
        elif "answer" in d:
            reply.content = d["answer"]
        elif "answer-json" in d:
            try:
                value = json.loads(d["answer-json"])
            except json.JSONDecodeError:
                value = d["answer-json"]
            reply.content = value if isinstance(value, str) else json.dumps(value)
        elif "quote" in d and after_tool:
            reply.content = f"From the sources: {message_text(last)}"
        else:
            reply.content = f"You said: {script.text}"
        prompt = sum(len(message_text(m).split()) + 4 for m in messages)
        completion = len(reply.content.split()) + sum(len(json.dumps(c["function"])) // 4 for c in reply.tool_calls)
        reply.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return reply


def _tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _words(text: str) -> Iterator[str]:
    """Word-sized pieces that join back to `text` exactly."""
    yield from re.findall(r"\s*\S+\s*|\s+", text)


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIStub
    server_version = "openai-stub/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read .requests; per-request stderr lines are noise

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/_requests":
            self._json(200, self.owner.requests)
        elif self.path.rstrip("/") == "/_provider":
            limits = self.owner.limits
            self._json(200, limits.stats() if limits else {})
        elif self.path.rstrip("/") == "/_provider/answers":
            limits = self.owner.limits
            self._json(200, list(limits.answers) if limits else [])
        elif self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_DELETE(self) -> None:
        if self.path.rstrip("/") == "/_requests":
            self.owner.clear()
            self._json(200, {"cleared": True})
        elif self.path.rstrip("/") == "/_provider" and self.owner.limits is not None:
            self.owner.limits.reset()
            self._json(200, {"reset": True})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError):
            self._json(400, {"error": {"message": "invalid JSON body"}})
            return
        owner = self.owner
        generation = owner.generation
        owner.record(body)
        messages = body.get("messages") or []
        script = Script.parse(messages)
        refusal = owner.scripted_refusal(script)
        if refusal is None and owner.limits is not None:
            refusal = owner.limits.enter(sum(len(message_text(m).split()) + 4 for m in messages))
            if refusal is None:
                try:
                    self._answer(body, messages, script, generation)
                finally:
                    owner.limits.leave()
                return
        if refusal is not None:
            owner.record_reply(refusal.status, None, generation)
            error = {"message": refusal.message, "type": "requests", "code": "rate_limit_exceeded"}
            self._json(refusal.status, {"error": error}, headers=refusal.headers)
            return
        self._answer(body, messages, script, generation)

    def _answer(self, body: dict[str, Any], messages: list[dict[str, Any]], script: Script, generation: int) -> None:
        owner = self.owner
        owner.wait(owner.latency + script.seconds("sleep") + owner.sleep_once(script) + owner.sleep_at(script))
        try:
            if "unauthorized" in script.directives:
                key = (self.headers.get("Authorization") or "").partition(" ")[2]
                owner.record_reply(401, None, generation)
                error = {"message": f"Incorrect API key provided: {key}", "type": "invalid_request_error"}
                self._json(401, {"error": {**error, "code": "invalid_api_key"}})
                return
            if owner.should_fail(script):
                owner.record_reply(500, None, generation)
                self._json(500, {"error": {"message": "stub failure", "type": "server_error"}})
                return
            reply = owner.reply_for(messages, script)
            owner.record_reply(200, reply, generation)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream(body, reply, max(owner.chunk_interval, script.seconds("slow")), include_usage)
            else:
                self._json(200, _completion(body, reply))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test): nothing to do

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, body: dict[str, Any], reply: Reply, interval: float, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        cid, created, model = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time()), str(body.get("model"))

        def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
            chunk.update(choices=choices, **extra)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        def delta(d: dict[str, Any], finish: str | None = None) -> None:
            send([{"index": 0, "delta": d, "finish_reason": finish}])

        delta({"role": "assistant", "content": ""})
        for i, word in enumerate(_words(reply.content)):
            if i:
                self.owner.wait(interval)
            delta({"content": word})
        for index, call in enumerate(reply.tool_calls):
            self.owner.wait(interval)
            head = {"index": index, "id": call["id"], "type": "function"}
            delta({"tool_calls": [{**head, "function": {"name": call["function"]["name"], "arguments": ""}}]})
            arguments = call["function"]["arguments"]
            for start in range(0, len(arguments), 8):  # arguments arrive in pieces, as OpenAI sends them
                piece = arguments[start : start + 8]
                delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        delta({}, reply.finish_reason)
        if include_usage:
            send([], usage=reply.usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model")),
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": reply.usage,
    }


def main(argv: list[str] | None = None, *, stub_class: type[OpenAIStub] | None = None) -> None:
    """Serve a stub until SIGTERM or Ctrl-C, printing its base URL (benchmarks pass their subclass)."""
    stub_class = stub_class or OpenAIStub
    parser = argparse.ArgumentParser(description="OpenAI-compatible chat completions stub")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before the first byte")
    parser.add_argument("--chunk-interval", type=float, default=0.0, help="seconds between streamed chunks")
    parser.add_argument("--rpm", type=float, default=None, help="server-wide requests per minute (429 beyond)")
    parser.add_argument("--tpm", type=float, default=None, help="server-wide tokens per minute (429 beyond)")
    parser.add_argument("--max-concurrent", type=int, default=None, help="requests in flight at once (429 beyond)")
    parser.add_argument("--burst", type=float, default=1.0, help="seconds of the rate limits one burst may use")
    parser.add_argument(
        "--window", type=float, default=None, help="enforce --rpm as a fixed window of this many seconds"
    )
    parser.add_argument("--record", choices=("on", "off"), default="on", help="keep request bodies (GET /_requests)")
    args = parser.parse_args(argv)
    limits = None
    if args.rpm or args.tpm or args.max_concurrent:
        limits = ProviderLimits(
            rpm=args.rpm,
            tpm=args.tpm,
            max_concurrent=args.max_concurrent,
            burst_seconds=args.burst,
            window=args.window,
        )
    stub = stub_class(
        host=args.host,
        port=args.port,
        latency=args.latency,
        chunk_interval=args.chunk_interval,
        limits=limits,
        keep_bodies=args.record == "on",
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with stub:
        print(stub.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stopped.wait()


if __name__ == "__main__":
    main()
