"""A webhook receiver for tests: a real local HTTP server (stdlib) that records what chatq POSTs.

Each path answers as scripted by `answer(path, ...)`: a list of status codes used in turn (the
last one repeats), a redirect `Location`, or a hold (the request waits until `release()`), so a
test can play a flaky, a slow or a redirecting receiver. Nothing of chatq is imported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

__all__ = ["Received", "Receiver"]


@dataclass(frozen=True)
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: bytes


@dataclass
class _Script:
    statuses: list[int] = field(default_factory=lambda: [200])
    location: str | None = None
    hold: bool = False


class Receiver:
    """start()/stop() or a context manager; `url(path)` is where chatq should POST."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._received: list[Received] = []
        self._scripts: dict[str, _Script] = {}
        self._released = threading.Event()
        self.holding = 0
        """Requests waiting on a hold right now."""
        self.max_holding = 0
        """The most requests that waited on a hold at once."""
        self._server: ThreadingHTTPServer | None = None

    def answer(self, path: str, *statuses: int, location: str | None = None, hold: bool = False) -> str:
        """Script `path`; returns its URL."""
        with self._lock:
            self._scripts[path] = _Script(statuses=list(statuses) or [200], location=location, hold=hold)
        return self.url(path)

    def url(self, path: str) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def release(self) -> None:
        """Let every held request (and later ones) answer."""
        self._released.set()

    def received(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return self._matching(path)

    def _matching(self, path: str | None) -> list[Received]:
        return [r for r in self._received if path is None or r.path == path]

    def wait_for(self, count: int, path: str | None = None, *, timeout: float = 30.0) -> list[Received]:
        """Wait until `count` requests (to `path`) arrived; return them."""
        self.wait_until(lambda: len(self._matching(path)) >= count, timeout=timeout, what=f"{count} request(s)")
        return self.received(path)

    def wait_until(
        self, condition: Callable[[], bool], *, timeout: float = 30.0, what: str = "a condition"
    ) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not condition():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the receiver did not see {what} in {timeout:g}s: {self._received}")
                self._lock.wait(min(left, 0.1))
            return list(self._received)

    def start(self) -> Receiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner._lock:
                    owner._received.append(Received(path=self.path, headers=headers, body=body))
                    script = owner._scripts.get(self.path, _Script())
                    status = script.statuses.pop(0) if len(script.statuses) > 1 else script.statuses[0]
                    owner._lock.notify_all()
                if script.hold:
                    owner._hold()
                self.send_response(status)
                if script.location is not None:
                    self.send_header("Location", script.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True).start()
        return self

    def _hold(self) -> None:
        with self._lock:
            self.holding += 1
            self.max_holding = max(self.max_holding, self.holding)
            self._lock.notify_all()
        try:
            self._released.wait(120)
        finally:
            with self._lock:
                self.holding -= 1
                self._lock.notify_all()

    def stop(self) -> None:
        self.release()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
