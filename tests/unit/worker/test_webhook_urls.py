"""Which webhook URLs chatq sends to, and the signature a receiver checks."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

import pytest

from worker.errors import WebhookRefused
from worker.runtime.webhooks.webhook_http import sign, signed_headers
from worker.webhook_urls import address_problem, resolve_target, validate_webhook


@pytest.mark.parametrize(
    "url", ["https://hooks.example.com/chatq?token=abc", "http://8.8.8.8:8080/h", "https://[2606:4700::1111]/x"]
)
def test_public_http_urls_are_kept(url: str) -> None:
    assert validate_webhook(f"  {url} ", allow_private=False) == url


def test_none_and_empty_mean_no_webhook() -> None:
    assert validate_webhook(None, allow_private=False) is None
    assert validate_webhook("", allow_private=False) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (42, r"must be an http\(s\) URL or null"),
        ("ftp://example.com/", "http:// or https://"),
        ("example.com/hook", "http:// or https://"),
        ("http://example.com:99999/", "not a valid URL"),
        ("http://example.com/#frag", "fragment"),
        ("http://u:p@example.com/", "user name or password"),
        ("http://example.com/" + "a" * 2100, "over the limit"),
        ("http://0.0.0.0/", "unspecified address"),
        ("http://224.0.0.1/", "multicast address"),
        ("http://192.168.1.10/", "private address"),
    ],
)
def test_what_is_refused_says_why_in_one_line(url: object, why: str) -> None:
    with pytest.raises(WebhookRefused, match=why) as caught:
        validate_webhook(url, allow_private=False)
    assert "\n" not in caught.value.message


def test_private_literals_pass_with_the_flag_and_names_are_only_resolved_when_sent() -> None:
    assert validate_webhook("http://127.0.0.1:9/h", allow_private=True) == "http://127.0.0.1:9/h"
    assert validate_webhook("http://localhost:9/h", allow_private=False) == "http://localhost:9/h"
    with pytest.raises(WebhookRefused, match="resolves to a loopback address"):
        resolve_target("http://localhost:9/h", allow_private=False)
    target = resolve_target("http://localhost:9/h?x=1", allow_private=True)
    assert (target.host, target.port, target.path, target.host_header) == ("localhost", 9, "/h?x=1", "localhost:9")
    assert ipaddress.ip_address(target.address).is_loopback
    with pytest.raises(WebhookRefused, match="does not resolve"):
        resolve_target("https://nowhere.invalid/h", allow_private=True)


def test_ipv4_mapped_addresses_are_judged_by_their_ipv4_address() -> None:
    assert address_problem(ipaddress.ip_address("::ffff:10.0.0.1")) == "a private address"
    assert address_problem(ipaddress.ip_address("::ffff:8.8.8.8")) is None
    assert address_problem(ipaddress.ip_address("100.64.0.1")) == "a non-public address"


def _receiver_accepts(headers: dict[str, str], body: bytes, secret: str) -> bool:
    """What docs/gateway.md tells a receiver to do: recompute over timestamp, delivery id and body."""
    signed = f"{headers['X-Chatq-Timestamp']}.{headers['X-Chatq-Delivery']}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers["X-Chatq-Signature"], f"sha256={expected}")


def test_the_signature_is_the_hmac_of_timestamp_delivery_id_and_body() -> None:
    body = b'{"id":"t","status":"succeeded"}'
    expected = hmac.new(b"s3cret", b"1764640000.d-1." + body, hashlib.sha256).hexdigest()
    assert sign("s3cret", 1764640000, "d-1", body) == f"sha256={expected}"
    headers = signed_headers(
        delivery_id="d-1", event="turn.succeeded", attempt=2, timestamp=1764640000, body=body, secret="s3cret"
    )
    assert headers["X-Chatq-Signature"] == f"sha256={expected}"
    assert (headers["X-Chatq-Delivery"], headers["X-Chatq-Attempt"], headers["X-Chatq-Timestamp"]) == (
        "d-1",
        "2",
        "1764640000",
    )
    unsigned = signed_headers(delivery_id="d", event="e", attempt=1, timestamp=1, body=body, secret=None)
    assert "X-Chatq-Signature" not in unsigned


def test_a_receiver_refuses_a_delivery_id_that_was_not_signed() -> None:
    # Receivers de-duplicate on X-Chatq-Delivery: a replay under a fresh id must not verify.
    body = b'{"id":"t","status":"succeeded"}'
    headers = signed_headers(delivery_id="d-1", event="turn.succeeded", attempt=1, timestamp=17, body=body, secret="k")
    assert _receiver_accepts(headers, body, "k")
    assert not _receiver_accepts({**headers, "X-Chatq-Delivery": "d-2"}, body, "k")
    assert not _receiver_accepts({**headers, "X-Chatq-Timestamp": "18"}, body, "k")
    assert not _receiver_accepts(headers, body + b" ", "k")
