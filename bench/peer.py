"""chatq beside LangGraph's own server (`langgraph dev`, in-memory runtime), alternating, same run.

`make bench-peer` installs the peer into a venv of its own (.local/peer-venv, pyproject's `peer`
extra) and runs `python -m bench peer`. Both sides run the same agent graph (bench/peer_graph.py is
chatq's nodes and edges) on the same model client against one stub process (bench/stub.py); each
round starts one side, measures it, stops it, then the other (the order flips every round), so
neither idles beside the other's measurement. chatq is plain `chatq worker` with no options (one
process per core, its default concurrency); the peer is `langgraph dev --n-jobs-per-worker 200`.

The peer runs offline: CLI analytics off (LANGGRAPH_CLI_NO_ANALYTICS), tracing off
(LANGSMITH_TRACING, no LangSmith key passed on), no browser, no reload; without a license or
control-plane key the server skips its metadata loop (it says so in its log). A proxy variable is
not used to fence it in: langchain-openai then swaps its HTTP transport, and the peer's model
client would no longer be the one users run.

Per side and round:
- `200@10s`, `200@2s`: 200 turns submitted at once (each with its own session/thread), model
  answering after S seconds: first submit -> last reply, against the ideal S. chatq's producer is
  the Python API in this process (create_session + submit_turn from 8 threads), its replies seen
  on pub/sub; the peer's turns are 200 client threads each POSTing `runs/wait` (thread created by
  the run). Peak RSS of the worker processes / server process tree, minus its idle RSS, per turn.
- `saturation`: 1,000 turns, instant model: throughput (turns/s, first submit -> last reply) and
  CPU per turn of every process that serves them: chatq's worker processes, Postgres (postmaster
  tree, exited backends included), Redis and the producer's submitting threads; the peer's server
  process tree. The peer's client keeps 200 runs in flight (its job limit).
- `raw`: chatq only: the same 1,000, and 200 at once at 2 s, as raw task messages (another
  language's producer: no Postgres write before the message, the worker inserts the turn and
  creates the session).
- `stream`: turns one at a time (0.2 s apart, so each meets an idle system), the stub streaming
  20 chunks 10 ms apart, each chunk carrying its send time: dispatch = submit -> first chunk
  leaving the stub (the model request), stream = chunk sent -> chunk at the subscriber (chatq:
  pub/sub; peer: its SSE `messages-tuple` stream), beside raw Redis pub/sub
  (bench/stream_latency.py's publisher).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_API_KEY,
    ROOT,
    Block,
    EventCapture,
    Sampler,
    Stub,
    Subprocess,
    isolated_services,
    log,
    percentile,
    use_stub,
)

MODEL = "gpt-4o-mini"
PEER_VENV = ROOT / ".local" / "peer-venv"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
AT_ONCE = 200
SATURATION = 1000
STREAM_TURNS, STREAM_CHUNKS, STREAM_INTERVAL = 20, 20, 0.01


# --- processes -------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree(root: int) -> list[int]:
    """`root` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds used by these process trees, children that exited and were reaped included."""
    total = 0
    for root in roots:
        for pid in tree(root):
            fields = _stat(pid)
            if fields:
                total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / CLOCK_TICKS


def tree_rss_kib(roots: list[int]) -> int:
    total = 0
    for root in roots:
        for pid in tree(root):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE_KIB
    return total


def listener_pid(port: int) -> int:
    """The pid of the process listening on 127.0.0.1:port (the private Postgres or Redis)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                    inodes.add(parts[9])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{entry}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(entry)
    raise RuntimeError(f"nothing listens on port {port}")


def outbound_requests(server_log: str) -> list[str]:
    """Requests the server's HTTP clients logged (httpx logs each at INFO) to other hosts than loopback."""
    found = re.findall(r"HTTP Request: [A-Z]+ (\S+)", re.sub(r"\x1b\[[0-9;]*m", "", server_log))
    return [url for url in found if not url.startswith(("http://127.0.0.1", "http://localhost"))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the two sides --------------------------------------------------------------------------------


class Side:
    """One system under test: start, submit N turns, stop; what it runs on for CPU and memory."""

    name = ""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def roots(self) -> list[int]:
        """Process trees whose CPU serves turns."""
        raise NotImplementedError

    def memory_roots(self) -> list[int]:
        """Process trees whose memory holds in-flight turns (the worker / the server)."""
        raise NotImplementedError

    def burst(self, contents: list[str], timeout: float) -> dict[str, Any]:
        """Submit every turn at once; wait for every reply. {first_submit, last_reply, producer_cpu, ok}."""
        raise NotImplementedError

    def streamed(self, content: str) -> tuple[float, list[tuple[float, float]]]:
        """One turn: (submit time, [(chunk stamp, received)])."""
        raise NotImplementedError


class Chatq(Side):
    name = "chatq"

    def __init__(self, stub: Stub, services: dict[str, str], extra: tuple[str, ...] = ()) -> None:
        self.stub = stub
        self.services = services
        self.extra = extra
        """More `chatq worker` options (bench/processes.py: `--processes 1 --concurrency 256`)."""
        if extra:
            self.name = "chatq " + " ".join(extra)
        self.worker: Subprocess | None = None
        self.capture: EventCapture | None = None

    def start(self) -> None:
        hostname = f"peerbench-{uuid.uuid4().hex[:6]}@%h"
        command = [sys.executable, "-m", "worker.cli", "worker", "--hostname", hostname]
        command += ["--without-gossip", "--without-mingle", *self.extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CHATQ_WORKER_SWEEP": "off"}
        self.worker = Subprocess("chatq-worker", command, env, ready=None).start()
        deadline = time.monotonic() + 120
        processes = _processes_of(command)
        while self.worker.log().count(" ready.") < processes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"chatq worker not ready:\n{self.worker.log()[-3000:]}")
            time.sleep(0.05)
        self.capture = EventCapture().__enter__()
        self.burst([f"warm up #{i}" for i in range(8)], timeout=60)

    def stop(self) -> None:
        if self.capture is not None:
            self.capture.__exit__(None, None, None)
            self.capture = None
        if self.worker is not None:
            self.worker.stop(timeout=30)
            self.worker = None

    def roots(self) -> list[int]:
        assert self.worker is not None
        pg = listener_pid(int(self.services["DATABASE_URL"].rsplit(":", 1)[1].split("/")[0]))
        redis = listener_pid(int(self.services["REDIS_URL"].rsplit(":", 1)[1].split("/")[0]))
        return [self.worker.pid, pg, redis]

    def memory_roots(self) -> list[int]:
        assert self.worker is not None
        return [self.worker.pid]

    def burst(self, contents: list[str], timeout: float, *, raw: bool = False) -> dict[str, Any]:
        from worker.producer import create_session, submit_turn

        assert self.capture is not None
        capture = self.capture
        turn_ids: list[uuid.UUID] = []
        lock = threading.Lock()
        cpu = [0.0]

        def submit(chunk: list[str]) -> None:
            started = time.thread_time()
            ids = []
            for content in chunk:
                if raw:
                    ids.append(_send_raw(content))
                else:
                    ids.append(submit_turn(create_session(framework="langgraph", model=MODEL), content).turn_id)
            with lock:
                turn_ids.extend(ids)
                cpu[0] += time.thread_time() - started

        parts = [contents[i::8] for i in range(8)]
        first = time.time()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(submit, parts))
        submitted = time.time() - first
        ended = capture.wait_all(turn_ids, timeout=timeout)
        finals = []
        ok = 0
        for turn in turn_ids:
            events = capture.of(turn)
            if events and events[-1][1].get("type") == "final":
                ok += 1
            finals.append(events[-1][0] if events else float("nan"))
        return {
            "first_submit": first,
            "last_reply": max(finals),
            "producer_cpu": cpu[0],
            "ok": ok,
            "ended": ended,
            "submit_s": submitted,
        }

    def streamed(self, content: str) -> tuple[float, list[tuple[float, float]]]:
        from worker.producer import create_session, submit_turn

        assert self.capture is not None
        session = create_session(framework="langgraph", model=MODEL)
        submitted = time.time()
        turn = submit_turn(session, content).turn_id
        self.capture.wait(turn, 30)
        chunks = []
        for received, event in self.capture.of(turn):
            if event.get("type") == "text":
                chunks += [(float(s), received) for s in event["text"].split() if s[:1].isdigit()]
        return submitted, chunks


def _processes_of(command: list[str]) -> int:
    from worker.cli.supervisor import default_processes, take_processes

    count, _ = take_processes(command)
    return count or default_processes()


def _send_raw(content: str) -> uuid.UUID:
    """A turn as another language's producer sends it: only the task message (the worker stores it)."""
    from worker.app import app

    turn_id, session_id = uuid.uuid4(), uuid.uuid4()
    kwargs = {"turn_id": str(turn_id), "session_id": str(session_id), "content": content, "images": None}
    app.send_task("chatq.run_turn", kwargs={**kwargs, "reply_to": None}, task_id=str(turn_id), queue="chatq")
    return turn_id


class Peer(Side):
    name = "langgraph"

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.server: Subprocess | None = None
        self.url = ""
        self.directory = Path(tempfile.mkdtemp(prefix="chatq-bench-peer-"))
        self.outbound: list[str] = []
        """HTTP requests the server logged to anything but this machine (none expected)."""

    def start(self) -> None:
        port = _free_port()
        config = self.directory / "langgraph.json"
        config.write_text(
            json.dumps({"dependencies": [str(ROOT)], "graphs": {"agent": str(ROOT / "bench/peer_graph.py:graph")}})
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("LANGSMITH", "LANGCHAIN"))},
            "PYTHONPATH": str(ROOT),
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
            "OPENAI_BASE_URL": self.stub.base_url,
            "OPENAI_API_KEY": BENCH_API_KEY,
            "PYTHONUNBUFFERED": "1",
        }
        command = [
            str(PEER_VENV / "bin" / "langgraph"),
            "dev",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-browser",
            "--no-reload",
            # blockbuster (which flags blocking calls on the event loop) off: it wraps every
            # blocking call of the process, a cost production servers do not pay.
            "--allow-blocking",
            "--n-jobs-per-worker",
            str(AT_ONCE),
        ]
        self.url = f"http://127.0.0.1:{port}"
        # In its own directory: the dev server keeps its state in `.langgraph_api/` under its cwd.
        self.server = Subprocess("langgraph-dev", command, env, ready=None, cwd=self.directory).start()
        deadline = time.monotonic() + 120
        import httpx

        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=2).status_code == 200:
                    break
            if self.server.process is not None and self.server.process.poll() is not None:
                raise RuntimeError(f"langgraph dev exited:\n{self.server.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"langgraph dev not ready:\n{self.server.log()[-3000:]}")
            time.sleep(0.2)
        self.burst([f"warm up #{i}" for i in range(8)], timeout=60)

    def stop(self) -> None:
        if self.server is not None:
            self.outbound += outbound_requests(self.server.log())
            self.server.stop(timeout=30)
            self.server = None

    def roots(self) -> list[int]:
        assert self.server is not None
        return [self.server.pid]

    def memory_roots(self) -> list[int]:
        return self.roots()

    def _run_body(self, content: str, **extra: Any) -> dict[str, Any]:
        return {
            "assistant_id": "agent",
            "input": {"messages": [{"role": "user", "content": content}]},
            "if_not_exists": "create",
            **extra,
        }

    def burst(self, contents: list[str], timeout: float) -> dict[str, Any]:
        import httpx

        finished: list[float] = []
        ok = [0]
        lock = threading.Lock()
        client = httpx.Client(base_url=self.url, timeout=timeout, limits=httpx.Limits(max_connections=AT_ONCE + 10))

        def one(content: str) -> None:
            response = client.post(f"/threads/{uuid.uuid4()}/runs/wait", json=self._run_body(content))
            now = time.time()
            good = response.status_code == 200 and bool((response.json() or {}).get("messages"))
            with lock:
                finished.append(now)
                ok[0] += good

        first = time.time()
        try:
            with ThreadPoolExecutor(min(AT_ONCE, len(contents))) as pool:
                list(pool.map(one, contents))
        finally:
            client.close()
        return {"first_submit": first, "last_reply": max(finished), "producer_cpu": 0.0, "ok": ok[0]}

    def streamed(self, content: str) -> tuple[float, list[tuple[float, float]]]:
        import httpx

        body = self._run_body(content, stream_mode=["messages-tuple"])
        chunks = []
        submitted = time.time()
        with (
            httpx.Client(base_url=self.url, timeout=60) as client,
            client.stream("POST", f"/threads/{uuid.uuid4()}/runs/stream", json=body) as response,
        ):
            event = ""
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "messages":
                    received = time.time()
                    message = json.loads(line[5:])[0]
                    text = message.get("content") if isinstance(message, dict) else None
                    if isinstance(text, str):
                        chunks += [(float(s), received) for s in text.split() if s[:1].isdigit()]
        return submitted, chunks


# --- measurements ---------------------------------------------------------------------------------


def _burst_figures(side: Side, latency: float, count: int) -> dict[str, float]:
    contents = [f"[sleep: {latency:g}] turn {i} of the burst" if latency else f"turn {i}" for i in range(count)]
    idle_rss = tree_rss_kib(side.memory_roots())
    roots = side.roots()
    cpu_before = tree_cpu(roots)

    def probe() -> dict[str, float]:
        return {"rss": float(tree_rss_kib(side.memory_roots()))}

    parts_before = [tree_cpu([root]) for root in roots]
    with Sampler(probe, 0.5) as sampler:
        result = side.burst(contents, timeout=latency * 6 + 300)
    parts = [tree_cpu([root]) - before for root, before in zip(roots, parts_before, strict=True)]
    cpu = tree_cpu(roots) - cpu_before + result["producer_cpu"]
    span = result["last_reply"] - result["first_submit"]
    return {
        "span": span,
        "submit_s": result.get("submit_s", float("nan")),
        "ok": result["ok"],
        "cpu_ms_per_turn": 1000 * cpu / count,
        "producer_ms_per_turn": 1000 * result["producer_cpu"] / count,
        "turns_per_s": count / span,
        "mem_mib_per_turn": (sampler.peak("rss") - idle_rss) / 1024 / count,
        "peak_mib": sampler.peak("rss") / 1024,
        # Per process tree (chatq: workers, Postgres, Redis), ms per turn.
        "cpu_parts": "/".join(f"{1000 * part / count:.1f}" for part in parts),  # type: ignore[dict-item]
    }


def _raw_figures(side: Chatq, count: int, latency: float = 0.0) -> dict[str, float]:
    roots = side.roots()
    cpu_before = tree_cpu(roots)
    contents = [f"[sleep: {latency:g}] raw turn {i}" if latency else f"raw turn {i}" for i in range(count)]
    result = side.burst(contents, timeout=latency * 6 + 300, raw=True)
    cpu = tree_cpu(roots) - cpu_before + result["producer_cpu"]
    span = result["last_reply"] - result["first_submit"]
    return {"span": span, "ok": result["ok"], "cpu_ms_per_turn": 1000 * cpu / count, "turns_per_s": count / span}


def _stream_figures(side: Side) -> dict[str, float]:
    dispatch, stream = [], []
    for i in range(STREAM_TURNS):
        submitted, chunks = side.streamed(f"[stamps: {STREAM_CHUNKS}] [slow: {STREAM_INTERVAL}] stream {i}")
        if chunks:
            dispatch.append(1000 * (chunks[0][0] - submitted))
            stream += [1000 * (received - stamp) for stamp, received in chunks]
        time.sleep(0.2)  # the next turn meets an idle system, whatever the last one left to finish
    return {
        "dispatch_p50": percentile(dispatch, 50),
        "stream_p50": percentile(stream, 50),
        "stream_p99": percentile(stream, 99),
        "chunks": float(len(stream)),
    }


def _measure(side: Side, quick: bool, *, raw: bool = True, stream: bool = True) -> dict[str, float]:
    out: dict[str, float] = {}
    side.start()
    try:
        for latency in (10.0, 2.0):
            log(f"{side.name}: {AT_ONCE} turns at once, model after {latency:g} s")
            r = _burst_figures(side, latency, AT_ONCE)
            out[f"span{latency:g}"] = r["span"]
            out[f"ok{latency:g}"] = r["ok"]
            out[f"submit{latency:g}"] = r["submit_s"]
            if latency == 10.0:
                out["mem_mib_per_turn"] = r["mem_mib_per_turn"]
                out["peak_mib"] = r["peak_mib"]
            log(f"{side.name}: {r}")
        count = 300 if quick else SATURATION
        log(f"{side.name}: {count} turns, instant model")
        r = _burst_figures(side, 0.0, count)
        out.update(turns_per_s=r["turns_per_s"], cpu_ms=r["cpu_ms_per_turn"], ok_sat=r["ok"])
        out["cpu_parts"] = r["cpu_parts"]  # type: ignore[assignment]
        out["producer_ms"] = r["producer_ms_per_turn"]
        log(f"{side.name}: {r}")
        if raw and isinstance(side, Chatq):
            log(f"chatq: {count} raw task messages, instant model")
            raw = _raw_figures(side, count)
            out.update(raw_turns_per_s=raw["turns_per_s"], raw_cpu_ms=raw["cpu_ms_per_turn"], raw_ok=raw["ok"])
            log(f"chatq raw: {raw}")
            log(f"chatq: {AT_ONCE} raw task messages at once, model after 2 s")
            raw2 = _raw_figures(side, AT_ONCE, latency=2.0)
            out.update(raw_span2=raw2["span"], raw_ok2=raw2["ok"])
            log(f"chatq raw: {raw2}")
        if stream:
            s = _stream_figures(side)
            out.update(s)
            log(f"{side.name}: {s}")
    finally:
        side.stop()
    return out


def _raw_pubsub() -> float:
    from bench.stream_latency import _raw_baseline

    return percentile(_raw_baseline(STREAM_TURNS * STREAM_CHUNKS, STREAM_INTERVAL), 50)


def _med(rounds: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rounds if key in r]
    return statistics.median(values) if values else float("nan")


def run(quick: bool = False) -> list[Block]:
    if not (PEER_VENV / "bin" / "langgraph").exists():
        raise RuntimeError("the peer is not installed: run `make bench-peer` (it installs .local/peer-venv)")
    rounds = 1 if quick else 3
    results: dict[str, list[dict[str, float]]] = {"chatq": [], "langgraph": []}
    with isolated_services("peer") as services, Stub() as stub:
        stub.start()
        use_stub(stub.base_url)
        sides: list[Side] = [Chatq(stub, services), Peer(stub)]
        for round_ in range(rounds):
            order = sides if round_ % 2 == 0 else sides[::-1]
            for side in order:
                log(f"round {round_ + 1}/{rounds}: {side.name}")
                results[side.name].append(_measure(side, quick))
        raw_p50 = _raw_pubsub()
    outbound = sides[1].outbound  # type: ignore[attr-defined]
    log(f"peer: {len(outbound)} outbound HTTP requests logged {outbound[:5]}")
    with contextlib.suppress(Exception):
        shutil.rmtree(sides[1].directory, ignore_errors=True)  # type: ignore[attr-defined]
    return _blocks(results, raw_p50, rounds)


def _spread(rounds: list[dict[str, float]], key: str, fmt: str = "{:.3g}") -> str:
    return ", ".join(fmt.format(r[key]) for r in rounds if key in r)


def _blocks(results: dict[str, list[dict[str, float]]], raw_p50: float, rounds: int) -> list[Block]:
    c, p = results["chatq"], results["langgraph"]
    per_round = f"medians of {rounds} alternating rounds"
    blocks = []
    for latency, limit in ((10.0, 1.05), (2.0, 1.4)):
        key = f"span{latency:g}"
        chatq_x, peer_x = _med(c, key) / latency, _med(p, key) / latency
        blocks.append(
            Block(
                name=f"peer.{AT_ONCE}@{latency:g}s",
                target=f"{AT_ONCE} turns at once, model at {latency:g} s: chatq's last reply <= {limit}x ideal",
                figure=_med(c, key),
                baseline=latency,
                baseline_label="ideal: the model latency",
                unit="s",
                limit=limit,
                details={
                    "chatq": f"{chatq_x:.3f}x ideal (rounds: {_spread(c, key)} s; ok {_spread(c, f'ok{latency:g}')})",
                    "peer": f"{peer_x:.3f}x ideal (rounds: {_spread(p, key)} s; ok {_spread(p, f'ok{latency:g}')})",
                    "ratio": f"chatq/peer {chatq_x / peer_x:.3f}",
                    "submit": f"chatq's producer took {_spread(c, f'submit{latency:g}')} s to submit the {AT_ONCE}",
                    **(
                        {"raw msgs": f"chatq, {AT_ONCE} raw task messages: {_med(c, 'raw_span2') / latency:.3f}x ideal"}
                        if latency == 2.0
                        else {}
                    ),
                },
            )
        )
    blocks.append(
        Block(
            name="peer.throughput",
            target="turns/s at saturation (instant model): chatq >= 1.7x the peer",
            figure=_med(c, "turns_per_s"),
            baseline=_med(p, "turns_per_s"),
            baseline_label=f"LangGraph server; {per_round}",
            unit="turns/s",
            limit=1.7,
            higher_is_better=True,
            details={
                "chatq": _spread(c, "turns_per_s"),
                "peer": _spread(p, "turns_per_s"),
                "raw msgs": f"chatq from raw task messages: {_spread(c, 'raw_turns_per_s')} turns/s",
            },
        )
    )
    blocks.append(
        Block(
            name="peer.cpu_per_turn",
            target="CPU per turn, all processes (chatq: workers, Postgres, Redis, producer) <= the peer's",
            figure=_med(c, "cpu_ms"),
            baseline=_med(p, "cpu_ms"),
            baseline_label=f"LangGraph server process tree; {per_round}",
            unit="ms",
            limit=1.0,
            details={
                "chatq": f"{_spread(c, 'cpu_ms')} ms (producer's share {_spread(c, 'producer_ms')} ms)",
                "split": "chatq workers/Postgres/Redis ms per turn: " + ", ".join(str(r.get("cpu_parts")) for r in c),
                "peer": f"{_spread(p, 'cpu_ms')} ms",
                "raw msgs": f"chatq from raw task messages: {_spread(c, 'raw_cpu_ms')} ms per turn",
            },
        )
    )
    blocks.append(
        Block(
            name="peer.dispatch_p50",
            target="submit -> model request p50: chatq ahead of the peer (ratio < 1)",
            figure=_med(c, "dispatch_p50"),
            baseline=_med(p, "dispatch_p50"),
            baseline_label=f"LangGraph server; {per_round}",
            unit="ms",
            limit=1.0,
            details={"chatq": _spread(c, "dispatch_p50"), "peer": _spread(p, "dispatch_p50")},
        )
    )
    blocks.append(
        Block(
            name="peer.stream_p50",
            target="token -> subscriber p50: chatq ahead of the peer (ratio < 1)",
            figure=_med(c, "stream_p50"),
            baseline=_med(p, "stream_p50"),
            baseline_label=f"LangGraph server's SSE stream; {per_round}",
            unit="ms",
            limit=1.0,
            details={
                "p99": f"chatq {_med(c, 'stream_p99'):.2f} ms, peer {_med(p, 'stream_p99'):.2f} ms",
                "raw": f"raw Redis pub/sub p50 {raw_p50:.2f} ms: chatq {_med(c, 'stream_p50') / raw_p50:.2f}x "
                "(target <= 2x)",
            },
        )
    )
    blocks.append(
        Block(
            name="peer.memory_per_turn",
            target="peak RSS per in-flight turn, 200 at 10 s (reported)",
            figure=_med(c, "mem_mib_per_turn"),
            baseline=_med(p, "mem_mib_per_turn"),
            baseline_label="LangGraph server",
            unit="MiB",
            limit=None,
            details={"peak": f"chatq workers {_med(c, 'peak_mib'):.0f} MiB, peer server {_med(p, 'peak_mib'):.0f} MiB"},
        )
    )
    return blocks
