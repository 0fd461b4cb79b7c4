"""The one tenant-name rule (`chatq.tenants`) and every place that applies it without a database:
the gateway's tokens, the task message, a batch line and its re-run, the command line's `--tenant`."""

from __future__ import annotations

import argparse
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from chatq.errors import ConfigError, InvalidTenant
from chatq.gateway_variables import parse_tenant_tokens
from chatq.settings import Settings
from chatq.tenants import TENANT_NAME, is_tenant_name, validate_tenant
from models.errors import KnowledgeBaseError
from models.knowledge import _tenant_name
from models.tables import TurnStatus
from worker.cli.batch import Conversation, parse_batch, turn_uuid
from worker.cli.batch_resume import Found, StoredConversation, StoredTurn, compare
from worker.cli.session_cli import tenant_arg
from worker.errors import InvalidTurn
from worker.payload import parse_turn_request
from worker.payload import validate_tenant as payload_tenant

TOKEN = "t" * 32
GOOD = ["a", "A", "7", "acme", "acme-corp.eu_1", "x" * 64, "0.-_"]
BAD = ["", " acme", "acme ", "a b", "acme:1", "a,b", ".acme", "-acme", "_acme", "x" * 65, "caf\u00e9", "a\nb", "a/b"]


@pytest.mark.parametrize("name", GOOD)
def test_a_valid_name_is_returned_as_given(name: str) -> None:
    assert validate_tenant(name) == name
    assert is_tenant_name(name)
    assert parse_tenant_tokens(f"{name}:{TOKEN}")[0].tenant == name


@pytest.mark.parametrize("name", BAD)
def test_an_invalid_name_is_one_line_naming_the_rule_everywhere(name: str) -> None:
    with pytest.raises(InvalidTenant) as raised:
        validate_tenant(name)
    message = raised.value.message
    assert "\n" not in message and message.startswith("tenant ") and "1-64 letters, digits" in message
    assert not is_tenant_name(name)
    # The gateway's tokens apply the same rule (it strips each entry, and splits on ':' and ',').
    if ":" not in name and "," not in name and name == name.strip():
        with pytest.raises(ConfigError, match="must be tenant:token"):
            parse_tenant_tokens(f"{name}:{TOKEN}")


def test_only_strings_are_names_and_long_input_is_cut() -> None:
    for value in (None, 7, b"acme", ["acme"]):
        assert not is_tenant_name(value)
        with pytest.raises(InvalidTenant, match="must be a string"):
            validate_tenant(value)
    with pytest.raises(InvalidTenant) as raised:
        validate_tenant("!" * 500)
    assert len(raised.value.message) < 200


def test_the_rule_is_one_pattern_no_other_module_repeats() -> None:
    import chatq.gateway_variables as gateway

    assert TENANT_NAME.pattern == r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
    assert not hasattr(gateway, "_TENANT_NAME"), "the gateway keeps no regex of its own"
    # A second copy of the rule would drift from this one: every module asks chatq.tenants.
    root = Path(__file__).resolve().parents[2]
    copies = sorted(
        str(path.relative_to(root))
        for package in ("chatq", "models", "handlers", "worker")
        for path in (root / package).rglob("*.py")
        if "{0,63}" in path.read_text(encoding="utf-8")
    )
    assert copies == ["chatq/tenants.py"]


def test_the_producer_and_the_task_refuse_a_bad_tenant_as_bad_input() -> None:
    assert payload_tenant(None) is None
    assert payload_tenant("acme") == "acme"
    with pytest.raises(InvalidTurn, match="is not a tenant name"):
        payload_tenant("a b")
    kwargs = {"session_id": str(uuid.uuid4()), "content": "hi"}
    task_id = str(uuid.uuid4())
    assert parse_turn_request(kwargs, task_id=task_id, settings=Settings()).tenant is None
    assert parse_turn_request({**kwargs, "tenant": "acme"}, task_id=task_id, settings=Settings()).tenant == "acme"
    for bad in ("a b", 3, ""):
        with pytest.raises(InvalidTurn, match="tenant"):
            parse_turn_request({**kwargs, "tenant": bad}, task_id=task_id, settings=Settings())


def test_a_knowledge_base_tenant_follows_the_same_rule() -> None:
    assert _tenant_name(None) is None
    assert _tenant_name(" acme ") == "acme"  # the CLI's argument, stripped as before
    with pytest.raises(KnowledgeBaseError, match="is not a tenant name"):
        _tenant_name("acme corp")


def test_the_command_lines_tenant_option_is_a_usage_error_when_bad() -> None:
    assert tenant_arg("acme") == "acme"
    with pytest.raises(argparse.ArgumentTypeError, match="is not a tenant name"):
        tenant_arg("a b")


def _lines(*lines: str, tenant: str | None = None) -> tuple[list[Conversation], list[str]]:
    conversations, errors = parse_batch([line + "\n" for line in lines], Settings(), tenant=tenant)
    return conversations, [str(error) for error in errors]


def test_a_batch_lines_tenant_overrides_the_batchs() -> None:
    plain = '{"id": "a", "turns": ["x"]}'
    own = '{"id": "b", "tenant": "globex", "turns": ["x"]}'
    none = '{"id": "c", "tenant": null, "turns": ["x"]}'
    conversations, errors = _lines(plain, own, none, tenant="acme")
    assert errors == []
    assert [(c.id, c.tenant) for c in conversations] == [("a", "acme"), ("b", "globex"), ("c", None)]
    conversations, errors = _lines(plain, own)
    assert [(c.id, c.tenant) for c in conversations] == [("a", None), ("b", "globex")]


def test_a_batch_line_with_a_bad_tenant_is_a_line_error() -> None:
    conversations, errors = _lines('{"id": "a", "turns": ["x"]}', '{"id": "b", "tenant": "a b", "turns": ["x"]}')
    assert [c.id for c in conversations] == ["a"]
    assert len(errors) == 1 and errors[0].startswith("line 2: tenant 'a b' is not a tenant name")


def test_a_rerun_under_another_tenant_is_a_change() -> None:
    conversation = Conversation(line=1, id="c", framework="none", model=None, system_prompt=None, turns=("hi",))
    stored = StoredConversation(
        framework="none",
        model=None,
        system_prompt=None,
        tenant="acme",
        next_position=1,
        turns=(StoredTurn(id=turn_uuid("b", "c", 0), status=TurnStatus.QUEUED, content="hi"),),
    )

    def ids(index: int) -> uuid.UUID:
        return turn_uuid("b", "c", index)

    assert compare(replace(conversation, tenant="acme"), stored, ids).found is Found.UNCHANGED
    changed = compare(conversation, stored, ids)
    assert (changed.found, changed.reason) == (Found.CHANGED, "tenant was 'acme'")
