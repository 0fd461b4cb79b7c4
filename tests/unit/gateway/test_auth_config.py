"""Token checks, loopback detection, access-log redaction and the gateway's settings."""

from __future__ import annotations

import logging

import pytest

from chatq.settings import Settings
from worker.errors import ConfigError
from worker.gateway.auth import bearer_token, host_header_is_loopback, is_loopback, token_matches
from worker.gateway.config import largest_valid_body, load_gateway_settings
from worker.gateway.server import RedactTokens, redact_query_token

TOKEN = "a" * 16 + "-secret"


def test_bearer_tokens_are_read_from_the_authorization_header() -> None:
    assert bearer_token({"authorization": f"Bearer {TOKEN}"}) == TOKEN
    assert bearer_token({"authorization": f"bearer   {TOKEN} "}) == TOKEN
    assert bearer_token({"authorization": f"Basic {TOKEN}"}) is None
    assert bearer_token({"authorization": "Bearer "}) is None
    assert bearer_token({}) is None


def test_tokens_match_only_exactly() -> None:
    assert token_matches(TOKEN, ["other-token-xxxxxxxx", TOKEN])
    assert not token_matches(TOKEN + "x", [TOKEN])
    assert not token_matches(TOKEN[:-1], [TOKEN])
    assert not token_matches(None, [TOKEN])
    assert not token_matches("\udcff-not-utf8", [TOKEN])
    assert not token_matches(TOKEN, [])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.example.com", ""])
def test_public_hosts(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize(
    ("header", "local"),
    [
        ("localhost:8000", True),
        ("127.0.0.1", True),
        ("[::1]:8000", True),
        ("evil.example:8000", False),
        ("localhost.evil.example", False),
        ("", False),
    ],
)
def test_host_headers(header: str, local: bool) -> None:
    assert host_header_is_loopback(header) is local


def test_access_tokens_are_redacted_from_the_access_log() -> None:
    assert redact_query_token("/turns/x/events?access_token=abc&last_event_id=3") == (
        "/turns/x/events?access_token=***&last_event_id=3"
    )
    assert redact_query_token("/turns/x/events?a=1&ACCESS_TOKEN=abc") == "/turns/x/events?a=1&ACCESS_TOKEN=***"
    # Starlette decodes names before looking them up: every spelling that authenticates is redacted.
    for name in ("access%5Ftoken", "access%5ftoken", "%61ccess_token", "access_%74oken", "access%5Ftoken"):
        assert redact_query_token(f"/turns/x/events?{name}=s3cr3t&b=2") == f"/turns/x/events?{name}=***&b=2"
    assert redact_query_token("/turns/x/events?access_tokens=keep") == "/turns/x/events?access_tokens=keep"
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, "%s %s", ("GET", "/e?access_token=s3"), None)
    assert RedactTokens().filter(record)
    assert record.getMessage() == "GET /e?access_token=***"


def test_settings_need_a_token_unless_unauthenticated() -> None:
    with pytest.raises(ConfigError, match="CHATQ_API_TOKEN"):
        load_gateway_settings({}, settings=Settings())
    open_settings = load_gateway_settings({}, unauthenticated=True, settings=Settings())
    assert open_settings.unauthenticated and open_settings.tokens == ()
    two = load_gateway_settings({"CHATQ_API_TOKEN": f"{TOKEN}, {TOKEN}-2"}, settings=Settings())
    assert two.tokens == (TOKEN, f"{TOKEN}-2")
    assert TOKEN not in repr(two)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"CHATQ_API_TOKEN": "hunter2"}, "shorter than 16"),
        ({"CHATQ_API_TOKEN": "hunter2 hunter2 hunter2"}, "without spaces"),
        ({"CHATQ_API_TOKEN": f"{TOKEN},hunter2"}, "token 2 of CHATQ_API_TOKEN"),
        ({"CHATQ_API_TOKEN": TOKEN, "CHATQ_SSE_HEARTBEAT": "0"}, "CHATQ_SSE_HEARTBEAT"),
        ({"CHATQ_API_TOKEN": TOKEN, "CHATQ_SSE_HEARTBEAT": "soon"}, "CHATQ_SSE_HEARTBEAT"),
        ({"CHATQ_API_TOKEN": TOKEN, "CHATQ_API_MAX_BODY_BYTES": "12"}, "CHATQ_API_MAX_BODY_BYTES"),
    ],
)
def test_bad_settings_fail_in_one_line(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_gateway_settings(env, settings=Settings())
    assert fragment in error.value.message
    assert "\n" not in error.value.message
    assert "hunter2" not in error.value.message and TOKEN not in error.value.message


def test_the_default_body_limit_fits_the_largest_valid_turn() -> None:
    settings = Settings()
    limit = load_gateway_settings({"CHATQ_API_TOKEN": TOKEN}, settings=settings).max_body_bytes
    assert limit == largest_valid_body(settings)
    # 4 images of 5 MB as base64 data URLs plus 100 000 characters, all escaped.
    assert limit > 4 * 5_000_000 * 4 // 3 + 6 * 100_000
    assert (
        load_gateway_settings(
            {"CHATQ_API_TOKEN": TOKEN, "CHATQ_API_MAX_BODY_BYTES": "4096"}, settings=settings
        ).max_body_bytes
        == 4096
    )


# ------------------------------------------------------------------------- scoped tokens (tenants)


def test_tenant_tokens_are_tenant_colon_token_pairs() -> None:
    from chatq.gateway_variables import TenantToken, parse_tenant_tokens

    parsed = parse_tenant_tokens(f" acme:{TOKEN} , globex.eu-1:{TOKEN}-2,acme:{TOKEN}-3 ")
    assert parsed == (
        TenantToken(tenant="acme", token=TOKEN),
        TenantToken(tenant="globex.eu-1", token=f"{TOKEN}-2"),
        TenantToken(tenant="acme", token=f"{TOKEN}-3"),
    )
    assert TOKEN not in repr(parsed)
    assert parse_tenant_tokens("") == ()


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (TOKEN, "entry 1 of CHATQ_API_TOKENS must be tenant:token"),
        (f":{TOKEN}", "must be tenant:token"),
        (f"a b:{TOKEN}", "must be tenant:token"),
        (f"{'x' * 65}:{TOKEN}", "must be tenant:token"),
        ("acme:short", "entry 1 of CHATQ_API_TOKENS: the token is shorter than 16"),
        (f"acme:{TOKEN},globex:{TOKEN} x", "entry 2 of CHATQ_API_TOKENS: the token must be printable ASCII"),
        (f"acme:{TOKEN},globex:{TOKEN}", "the same token is given to tenants 'acme' and 'globex'"),
    ],
)
def test_bad_tenant_tokens_are_refused_in_one_line_without_the_token(raw: str, fragment: str) -> None:
    from chatq.gateway_variables import load_gateway_variables

    with pytest.raises(ConfigError) as error:
        load_gateway_variables({"CHATQ_API_TOKENS": raw})
    assert fragment in error.value.message
    assert "\n" not in error.value.message and TOKEN not in error.value.message


def test_scoped_tokens_alone_start_a_gateway_and_may_not_double_as_admin_tokens() -> None:
    gateway = load_gateway_settings({"CHATQ_API_TOKENS": f"acme:{TOKEN}-t"}, settings=Settings())
    assert gateway.tokens == () and [t.tenant for t in gateway.tenant_tokens] == ["acme"]
    with pytest.raises(ConfigError, match="also in CHATQ_API_TOKEN"):
        load_gateway_settings(
            {"CHATQ_API_TOKENS": f"acme:{TOKEN}-t", "CHATQ_API_TOKEN": f"{TOKEN}-t"}, settings=Settings()
        )


def test_a_token_matches_its_tenant_or_the_admin_and_nothing_else() -> None:
    from worker.gateway.auth import ADMIN, match_token

    scoped = [("acme", f"{TOKEN}-a"), ("globex", f"{TOKEN}-g")]
    assert match_token(TOKEN, [TOKEN], scoped) == ADMIN
    assert match_token(f"{TOKEN}-a", [TOKEN], scoped) == "acme"
    assert match_token(f"{TOKEN}-g", [TOKEN], scoped) == "globex"
    for wrong in (f"{TOKEN}-", f"{TOKEN}-ax", None, "\udcff"):
        assert match_token(wrong, [TOKEN], scoped) is None


def test_scoped_tokens_are_masked_as_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    from chatq.masking import mask_secrets

    monkeypatch.setenv("CHATQ_API_TOKENS", f"acme:{TOKEN}-masked")
    assert mask_secrets(f"token {TOKEN}-masked leaked") == "token *** leaked"
