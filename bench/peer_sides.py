"""The two systems the side-by-side runs: plain `chatq worker`, and `langgraph dev`.

Each is started fresh for every figure (bench/peer.py), warmed with 8 turns, measured, stopped.
A side names its process trees by part (`parts()`: chatq's workers, Postgres and Redis; the
peer's server) for CPU and memory alike, and how many processes run turns (`serving()`).
Warm-up, stream turns and the busy-queue load run in the benchmark process (their CPU is not
counted); measured bursts run in bench/peer_client.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import BENCH_API_KEY, ROOT, EventCapture, Stub, Subprocess
from bench.peer_client import MODEL, contents
from bench.peer_procs import free_port, listener_pid, outbound_requests, port_of, tree_size

PEER_VENV = ROOT / ".local" / "peer-venv"
WARM_UP = 8


class Side:
    """One system under test."""

    name = ""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def parts(self) -> dict[str, int]:
        """Process-tree roots by part, for CPU and memory."""
        raise NotImplementedError

    def serving(self) -> int:
        """How many processes run turns."""
        raise NotImplementedError

    def describe(self) -> str:
        """The processes this side ran, in words."""
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        """What bench/peer_client.py needs to reach this side."""
        raise NotImplementedError

    def one(self, content: str) -> None:
        """One turn, waited for (warm-up and the busy-queue load)."""
        raise NotImplementedError

    def streamed(self, content: str) -> tuple[float, list[tuple[float, float]]]:
        """One turn: (submit time, [(chunk stamp, received)])."""
        raise NotImplementedError

    def warm_up(self) -> None:
        with ThreadPoolExecutor(WARM_UP) as pool:
            list(pool.map(self.one, contents(WARM_UP, 0.0, "warm up")))

    @contextlib.contextmanager
    def busy(self, in_flight: int, latency: float) -> Any:
        """Keep `in_flight` turns of `latency` s running until the block ends (the queue never idles)."""
        stop = threading.Event()

        def loop(index: int) -> None:
            n = 0
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    self.one(f"[sleep: {latency:g}] busy {index}.{n}")
                n += 1

        threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(in_flight)]
        for thread in threads:
            thread.start()
        time.sleep(latency + 0.5)  # every loop has a turn in flight
        try:
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join(latency + 60)


def chatq_command() -> list[str]:
    """`chatq worker`, no options, as its users run it (the console script beside this interpreter)."""
    script = Path(sys.executable).parent / "chatq"
    return [str(script), "worker"] if script.exists() else [sys.executable, "-m", "worker.cli", "worker"]


class Chatq(Side):
    name = "chatq"

    def __init__(self, stub: Stub, services: dict[str, str], extra: tuple[str, ...] = ()) -> None:
        self.stub = stub
        self.services = services
        self.extra = extra
        """More `chatq worker` options (bench/processes.py: `--processes 1 --concurrency 256`); none here."""
        if extra:
            self.name = "chatq " + " ".join(extra)
        self.worker: Subprocess | None = None
        self.capture: EventCapture | None = None
        self.processes = 0

    def start(self) -> None:
        from worker.cli.supervisor import default_processes, take_processes

        self.processes = take_processes(self.extra)[0] or default_processes()
        command = [*chatq_command(), *self.extra]
        self.worker = Subprocess("chatq-worker", command, {**os.environ, "PYTHONUNBUFFERED": "1"}, ready=None)
        self.worker.start()
        deadline = time.monotonic() + 120
        while self.worker.log().count(" ready.") < self.processes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"chatq worker not ready:\n{self.worker.log()[-3000:]}")
            time.sleep(0.05)
        self.capture = EventCapture().__enter__()
        self.warm_up()

    def stop(self) -> None:
        if self.capture is not None:
            self.capture.__exit__(None, None, None)
            self.capture = None
        if self.worker is not None:
            self.worker.stop(timeout=30)
            self.worker = None

    def parts(self) -> dict[str, int]:
        assert self.worker is not None
        return {
            "workers": self.worker.pid,
            "postgres": listener_pid(port_of(self.services["DATABASE_URL"])),
            "redis": listener_pid(port_of(self.services["REDIS_URL"])),
        }

    def serving(self) -> int:
        return self.processes

    def describe(self) -> str:
        parts = self.parts()
        command = " ".join(["chatq worker", *self.extra])
        workers = f"{tree_size(parts['workers'])} process(es), {self.processes} of them Celery workers"
        services = f"Postgres {tree_size(parts['postgres'])}, Redis {tree_size(parts['redis'])}"
        return f"chatq: `{command}` = {workers}; {services}"

    def spec(self) -> dict[str, Any]:
        return {"side": "chatq", "threads": 8}

    def one(self, content: str) -> None:
        from worker.producer import create_session, submit_turn

        assert self.capture is not None
        turn = submit_turn(create_session(framework="langgraph", model=MODEL), content).turn_id
        if not self.capture.wait(turn, 120):
            raise RuntimeError(f"chatq turn {turn} did not end")

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


class Peer(Side):
    name = "langgraph"

    def __init__(self, stub: Stub, jobs: int) -> None:
        self.stub = stub
        self.jobs = jobs
        self.server: Subprocess | None = None
        self.url = ""
        self.directory: Path | None = None
        self.outbound: list[str] = []
        """HTTP requests the server logged to anything but this machine (none expected)."""

    def start(self) -> None:
        import httpx

        port = free_port()
        # A fresh directory every start: the dev server keeps its state in `.langgraph_api/` under its cwd.
        self.directory = Path(tempfile.mkdtemp(prefix="chatq-bench-peer-"))
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
        command = [str(PEER_VENV / "bin" / "langgraph"), "dev", "--config", str(config)]
        command += ["--host", "127.0.0.1", "--port", str(port), "--no-browser", "--no-reload"]
        # blockbuster (which flags blocking calls on the event loop) off: it wraps every blocking
        # call of the process, a cost production servers do not pay.
        command += ["--allow-blocking", "--n-jobs-per-worker", str(self.jobs)]
        self.url = f"http://127.0.0.1:{port}"
        self.server = Subprocess("langgraph-dev", command, env, ready=None, cwd=self.directory).start()
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=2).status_code == 200:
                    break
            if self.server.process is not None and self.server.process.poll() is not None:
                raise RuntimeError(f"langgraph dev exited:\n{self.server.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"langgraph dev not ready:\n{self.server.log()[-3000:]}")
            time.sleep(0.2)
        self.warm_up()

    def stop(self) -> None:
        import shutil

        if self.server is not None:
            self.outbound += outbound_requests(self.server.log())
            self.server.stop(timeout=30)
            self.server = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def parts(self) -> dict[str, int]:
        assert self.server is not None
        return {"server": self.server.pid}

    def serving(self) -> int:
        return tree_size(self.parts()["server"])

    def describe(self) -> str:
        return f"peer: `langgraph dev` = {tree_size(self.parts()['server'])} process(es), state in memory"

    def spec(self) -> dict[str, Any]:
        return {"side": "peer", "url": self.url, "threads": self.jobs}

    def _body(self, content: str, **extra: Any) -> dict[str, Any]:
        body = {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": content}]}}
        return {**body, "if_not_exists": "create", **extra}

    def one(self, content: str) -> None:
        import httpx

        response = httpx.post(f"{self.url}/threads/{uuid.uuid4()}/runs/wait", json=self._body(content), timeout=120)
        response.raise_for_status()

    def streamed(self, content: str) -> tuple[float, list[tuple[float, float]]]:
        import httpx

        body = self._body(content, stream_mode=["messages-tuple"])
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
