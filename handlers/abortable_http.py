"""An httpx2 transport whose requests the turn's abort signal (`handlers.abort`) stops at once.

Adapters that call a model over HTTP (the openai SDK under langchain-openai, the plain_openai
adapter) build their client with `abortable_transport()` (on httpx2, the HTTP client the openai
SDK is built on). While a request reads or writes its
socket, it registers a stop with the current turn's `AbortSignal`; `abort()` shuts the socket down
(`shutdown(SHUT_RDWR)` wakes a blocked `recv`, where `close()` would not), the read fails at once
with `httpx2.ReadError`, and the SDK raises its connection error. So a cancelled turn whose model
has sent nothing for minutes stops within the lease keeper's poll, not at the next chunk.

Built on httpcore2's public API (`ConnectionPool(network_backend=...)`, the `NetworkStream`
interface) rather than httpx2.HTTPTransport's private pool; it speaks HTTP/1.1 with the pool
limits the openai SDK uses. Requests through an environment proxy go through httpx2's own
transport and are stopped between chunks only.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import typing
from collections.abc import Iterable, Iterator

import httpcore2
import httpx2

from handlers.abort import AbortSignal, current_abort

__all__ = ["DEFAULT_LIMITS", "AbortableTransport", "abortable_transport"]

DEFAULT_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
"""The openai SDK's connection limits, kept for the client it would otherwise build."""

# httpcore2's errors as httpx2 raises them, most specific first (what the SDKs catch: httpx2's).
_ERRORS: tuple[tuple[type[Exception], type[httpx2.TransportError]], ...] = (
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.ProxyError, httpx2.ProxyError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for source, target in _ERRORS:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


class _AbortableStream(httpcore2.NetworkStream):
    """A connection's stream: each read and write can be stopped by the turn's signal."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._active: AbortSignal | None = None
        self._shut = self._shut_if_aborted  # one bound method, not one per read

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        signal = current_abort()
        if signal is None:
            return self._inner.read(max_bytes, timeout)
        # Plain try/finally rather than context managers: this runs for every streamed chunk.
        key = self._guard(signal)
        try:
            data = self._inner.read(max_bytes, timeout)
        except httpcore2.NetworkError:
            if signal.aborted:
                raise httpcore2.ReadError(f"the request was aborted ({signal.reason})") from None
            raise
        finally:
            self._unguard(signal, key)
        if signal.aborted:
            raise httpcore2.ReadError(f"the request was aborted ({signal.reason})")
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        signal = current_abort()
        if signal is None:
            self._inner.write(buffer, timeout)
            return
        key = self._guard(signal)
        try:
            self._inner.write(buffer, timeout)
        except httpcore2.NetworkError:
            if signal.aborted:
                raise httpcore2.WriteError(f"the request was aborted ({signal.reason})") from None
            raise
        finally:
            self._unguard(signal, key)
        if signal.aborted:
            raise httpcore2.WriteError(f"the request was aborted ({signal.reason})")

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        return _AbortableStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)

    def _guard(self, signal: AbortSignal) -> int:
        with self._lock:
            self._active = signal
        return signal.watch(self._shut)

    def _unguard(self, signal: AbortSignal, key: int) -> None:
        signal.unwatch(key)
        with self._lock:
            self._active = None

    def _shut_if_aborted(self) -> None:
        # Only while an aborted signal's request is on the socket: a stream back in the pool may
        # already carry another turn's request.
        with self._lock:
            if self._active is None or not self._active.aborted:
                return
            sock = self._inner.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _AbortableBackend(httpcore2.NetworkBackend):
    """httpcore2's sync backend, its streams wrapped in `_AbortableStream`."""

    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.NetworkStream:
        return _AbortableStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None
    ) -> httpcore2.NetworkStream:
        return _AbortableStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _ResponseStream(httpx2.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            with _as_httpx():
                close()


class AbortableTransport(httpx2.BaseTransport):
    """HTTP/1.1 over an httpcore2 pool whose connections honour the current turn's abort signal."""

    def __init__(self, *, limits: httpx2.Limits = DEFAULT_LIMITS, verify: ssl.SSLContext | bool = True) -> None:
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_AbortableBackend(),
        )

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        signal = current_abort()
        if signal is not None and signal.aborted:
            raise httpx2.ReadError(f"the request was aborted ({signal.reason})", request=request)
        core = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=typing.cast(Iterable[bytes], request.stream),
            extensions=request.extensions,
        )
        with _as_httpx():
            response = self._pool.handle_request(core)
        return httpx2.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(typing.cast(Iterable[bytes], response.stream)),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def abortable_transport() -> AbortableTransport:
    """A transport for a model client (one per client: it holds the client's connection pool)."""
    return AbortableTransport()
