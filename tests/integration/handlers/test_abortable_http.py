"""The model clients' transport: an abort closes a request whose server sends nothing, and only that one.

A real local HTTP server that stalls stands in for a silent model (it is the boundary the
abort acts on); the client is the same httpx2 client the openai SDK is given.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest

from handlers.abort import AbortSignal, abortable
from handlers.abortable_http import abortable_transport

STALL_SECONDS = 30.0
"""How long the server waits before (or in the middle of) its answer."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    release = threading.Event()
    received = threading.Event()
    peers: set[int] = set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self.server.peers.add(self.client_address[1])
        self.server.received.set()
        with contextlib.suppress(OSError):  # the client went away: that is the point
            self._answer()

    def _answer(self) -> None:
        if self.path == "/silent":
            self.server.release.wait(STALL_SECONDS)
        if self.path == "/half":
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.write(b"hello")
            self.wfile.flush()
            self.server.release.wait(STALL_SECONDS)
            self.wfile.write(b"world")
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.release = threading.Event()
    srv.received = threading.Event()
    srv.peers = set()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def _url(server: _Server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def _abort_soon(signal: AbortSignal, after: threading.Event) -> None:
    """Abort from another thread once `after` is set (the server has the request)."""

    def run() -> None:
        after.wait(10)
        signal.abort("cancelled")

    threading.Thread(target=run, daemon=True).start()


@pytest.mark.parametrize("path", ["/silent", "/half"])
def test_an_abort_ends_a_request_whose_server_sends_nothing_long_before_the_stall(server: _Server, path: str) -> None:
    client = httpx2.Client(transport=abortable_transport(), timeout=STALL_SECONDS * 2)
    signal = AbortSignal()
    _abort_soon(signal, server.received)
    started = time.monotonic()
    with (
        abortable(signal),
        pytest.raises(httpx2.ReadError, match="aborted"),
        client.stream("GET", _url(server, path)) as response,
    ):
        response.read()
    took = time.monotonic() - started
    assert took < STALL_SECONDS / 4, took
    client.close()


def test_without_an_abort_requests_complete_and_reuse_their_connection(server: _Server) -> None:
    client = httpx2.Client(transport=abortable_transport(), timeout=5)
    with abortable(AbortSignal()):
        assert [client.get(_url(server, "/fast")).text for _ in range(3)] == ["ok", "ok", "ok"]
    assert client.get(_url(server, "/fast")).text == "ok"  # outside a turn too
    assert len(server.peers) == 1
    client.close()


def test_an_aborted_turn_leaves_other_turns_requests_alone(server: _Server) -> None:
    client = httpx2.Client(transport=abortable_transport(), timeout=5)
    aborted = AbortSignal()
    aborted.abort("cancelled")
    with abortable(aborted), pytest.raises(httpx2.ReadError):
        client.get(_url(server, "/fast"))
    with abortable(AbortSignal()):
        assert client.get(_url(server, "/fast")).text == "ok"
    client.close()
