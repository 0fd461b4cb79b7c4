"""One webhook POST: signed headers, a connection to the checked address, a hard time limit, no redirects.

Signature (docs/contract.md, "Webhooks"): with `CHATQ_WEBHOOK_SECRET` set, every attempt carries

    X-Chatq-Timestamp: <unix seconds of this attempt>
    X-Chatq-Signature: sha256=<hex HMAC-SHA256(secret, f"{timestamp}.{delivery}.".encode() + raw_body)>

so a receiver recomputes the HMAC over the timestamp, a dot, the `X-Chatq-Delivery` id, a dot and
the exact body bytes, compares in constant time, and refuses old timestamps (replays). The delivery
id is signed because receivers de-duplicate on it: unsigned, a replay under a fresh id would pass.
The body is the same bytes on every attempt; the timestamp and so the signature are the attempt's own.

The stdlib `http.client` on purpose: it follows no redirects (a 3xx is an answer, recorded and
retried, never followed to another host), and it connects to the address `worker.webhook_urls`
checked while TLS still verifies the URL's host name. A timer shuts the socket down when the
attempt's time is up, so a receiver that trickles bytes cannot hold a worker thread past it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from worker.webhook_urls import Target

__all__ = ["Answer", "post", "sign", "signed_headers"]

USER_AGENT = "chatq-webhook/1"
_MAX_ANSWER_BYTES = 64 * 1024
"""Read at most this much of a receiver's answer (it is not used, only drained)."""


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What one attempt got."""

    status_code: int | None
    """The receiver's HTTP status (None: no answer)."""
    error: str | None
    """Why it is not a delivery (None: a 2xx)."""

    @property
    def delivered(self) -> bool:
        """True for a 2xx answer."""
        return self.error is None


def sign(secret: str, timestamp: int, delivery_id: str, body: bytes) -> str:
    """The `X-Chatq-Signature` value: `sha256=` and the hex HMAC-SHA256 of `f"{timestamp}.{delivery_id}." + body`."""
    signed = f"{timestamp}.{delivery_id}.".encode("ascii") + body
    return "sha256=" + hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


def signed_headers(
    *, delivery_id: str, event: str, attempt: int, timestamp: int, body: bytes, secret: str | None
) -> dict[str, str]:
    """The headers of one attempt (the signature only with a secret)."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Chatq-Delivery": delivery_id,
        "X-Chatq-Event": event,
        "X-Chatq-Attempt": str(attempt),
        "X-Chatq-Timestamp": str(timestamp),
    }
    if secret:
        headers["X-Chatq-Signature"] = sign(secret, timestamp, delivery_id, body)
    return headers


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address, verifying the certificate of the URL's host name."""

    def __init__(self, target: Target, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(target.address, target.port, timeout=timeout, context=self._tls)
        self._server_name = target.host

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def post(target: Target, body: bytes, headers: Mapping[str, str], *, timeout: float) -> Answer:
    """POST `body` to `target` within `timeout` seconds in all (connect, send, answer)."""
    conn: http.client.HTTPConnection
    if target.scheme == "https":
        conn = _PinnedHTTPS(target, timeout)
    else:
        conn = http.client.HTTPConnection(target.address, target.port, timeout=timeout)
    expired = threading.Event()

    def time_up() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, time_up)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", target.path, body=body, headers={**headers, "Host": target.host_header})
        answer = conn.getresponse()
        answer.read(_MAX_ANSWER_BYTES)
        status = answer.status
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            return Answer(status_code=None, error=f"no answer within {timeout:g} s")
        return Answer(status_code=None, error=_describe(exc))
    finally:
        timer.cancel()
        conn.close()
    if 200 <= status < 300:
        return Answer(status_code=status, error=None)
    if 300 <= status < 400:
        return Answer(status_code=status, error=f"HTTP {status}: a redirect, not followed")
    return Answer(status_code=status, error=f"HTTP {status}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate not valid for the host"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({type(exc).__name__})"
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError):
        return "the receiver closed the connection"
    if isinstance(exc, http.client.HTTPException):
        return f"not an HTTP answer ({type(exc).__name__})"
    return f"could not connect ({type(exc).__name__})"
