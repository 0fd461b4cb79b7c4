"""Which webhook URLs chatq sends to: http(s) only, and never to a private address (server-side request forgery).

Checked twice. When a session or turn is stored (`validate_webhook`): the URL's form, and a host
given as an IP address. When a delivery is sent (`resolve_target`): the host is resolved and every
address it resolves to must be public (`ipaddress`: not private, loopback, link-local, multicast,
reserved or unspecified, also inside an IPv4-mapped IPv6 address); the delivery then connects to
the address that was checked, so a DNS answer that changes in between cannot point it elsewhere.
`CHATQ_WEBHOOK_ALLOW_PRIVATE=1` lifts the address rule (a receiver on the same network, tests).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from worker.errors import WebhookRefused

__all__ = ["MAX_URL_CHARS", "Target", "address_problem", "resolve_target", "validate_webhook"]

MAX_URL_CHARS = 2048
"""Longest webhook URL accepted."""

_SCHEMES = {"http": 80, "https": 443}


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where one delivery attempt connects, checked."""

    scheme: str
    """`http` or `https`."""
    host: str
    """The URL's host name (TLS server name and certificate check)."""
    port: int
    """The port."""
    address: str
    """The checked IP address the attempt connects to."""
    path: str
    """Path and query, as sent in the request line."""

    @property
    def host_header(self) -> str:
        """The Host header: the host, with the port unless it is the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _SCHEMES[self.scheme] else f"{host}:{self.port}"


def validate_webhook(url: object, *, allow_private: bool, name: str = "webhook") -> str | None:
    """The URL to store (None for none), or WebhookRefused naming what is wrong, in one line."""
    if url is None or url == "":
        return None
    if not isinstance(url, str):
        raise WebhookRefused(f"{name} must be an http(s) URL or null, got {type(url).__name__}")
    _split(url, name)
    host = urlsplit(url.strip()).hostname or ""
    literal = _ip(host)
    if literal is not None and not allow_private:
        problem = address_problem(literal)
        if problem:
            raise WebhookRefused(
                f"{name} points at {problem} ({host}); to allow it, set CHATQ_WEBHOOK_ALLOW_PRIVATE=1 where it "
                "is stored and in the workers' environment (they check again when they send)"
            )
    return url.strip()


def resolve_target(url: str, *, allow_private: bool) -> Target:
    """Resolve the URL's host and check every address; WebhookRefused when one is not public (unless allowed)."""
    parts = _split(url, "webhook")
    host = parts.hostname or ""
    port = parts.port or _SCHEMES[parts.scheme]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookRefused(f"webhook host {host!r} does not resolve ({exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise WebhookRefused(f"webhook host {host!r} does not resolve")
    if not allow_private:
        for address in addresses:
            ip = _ip(address)
            problem = address_problem(ip) if ip is not None else "an unreadable address"
            if problem:
                raise WebhookRefused(
                    f"webhook host {host!r} resolves to {problem} ({address}); to allow it, set "
                    "CHATQ_WEBHOOK_ALLOW_PRIVATE=1 in the environment of the workers (they send the POST)"
                )
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(scheme=parts.scheme, host=host, port=port, address=addresses[0], path=path)


def address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What kind of non-public address `ip` is (None: a public one)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind, flag in (
        # The narrower kinds first: Python counts loopback and link-local addresses as private too.
        ("a loopback address", ip.is_loopback),
        ("a link-local address", ip.is_link_local),
        ("an unspecified address", ip.is_unspecified),
        ("a multicast address", ip.is_multicast),
        ("a private address", ip.is_private),
        ("a reserved address", ip.is_reserved),
    ):
        if flag:
            return kind
    if not ip.is_global:
        return "a non-public address"
    return None


def _split(url: str, name: str) -> SplitResult:
    text = url.strip()
    if len(text) > MAX_URL_CHARS:
        raise WebhookRefused(f"{name} is {len(text)} characters long, over the limit of {MAX_URL_CHARS}")
    if any(not ch.isprintable() or ch.isspace() for ch in text):
        raise WebhookRefused(f"{name} must not contain spaces or control characters")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        raise WebhookRefused(f"{name} is not a valid URL ({exc})") from None
    if parts.scheme not in _SCHEMES:
        raise WebhookRefused(f"{name} must be an http:// or https:// URL, got scheme {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise WebhookRefused(f"{name} has no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused(f"{name} must not carry a user name or password (put a token in its path or query)")
    if parts.fragment:
        raise WebhookRefused(f"{name} must not have a #fragment")
    return parts


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None
