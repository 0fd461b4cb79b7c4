"""A framework registered by a CHATQ_PLUGINS module at run time can be chosen wherever sessions are made.

The producer, the batch loader and the gateway read the one framework registry (`handlers`), which
imports the CHATQ_PLUGINS modules first: no list of frameworks is kept anywhere else.
"""

from __future__ import annotations

import json

import pytest

from chatq.settings import get_settings
from handlers import framework_names
from models.db import session_scope
from models.tables import ChatSession
from tests.support.handlers import STREAM_ONLY_PLUGIN, plugin_installed
from worker.cli.batch import parse_batch
from worker.errors import InvalidTurn
from worker.gateway.app import DEFAULT_FRAMEWORK, framework_options
from worker.gateway.openapi import base_schema
from worker.producer import create_session

pytestmark = pytest.mark.usefixtures("chatq_env")

FRAMEWORK = "stream_only"
LINE = json.dumps({"id": "c1", "session": {"framework": FRAMEWORK}, "turns": ["hi"]})


def test_without_the_plugin_the_framework_is_refused_everywhere() -> None:
    assert FRAMEWORK not in framework_names()
    with pytest.raises(InvalidTurn, match="unknown agent framework 'stream_only'"):
        create_session(framework=FRAMEWORK)
    conversations, errors = parse_batch([LINE], get_settings())
    assert conversations == [] and len(errors) == 1 and "unknown framework 'stream_only'" in errors[0].message


def test_create_session_accepts_a_plugin_framework() -> None:
    with plugin_installed(STREAM_ONLY_PLUGIN, FRAMEWORK):
        session_id = create_session(framework=FRAMEWORK)
    with session_scope() as db:
        row = db.get(ChatSession, session_id)
        assert row is not None and row.agent_framework == FRAMEWORK


def test_the_batch_loader_accepts_a_plugin_framework() -> None:
    with plugin_installed(STREAM_ONLY_PLUGIN, FRAMEWORK):
        conversations, errors = parse_batch([LINE], get_settings())
    assert errors == []
    assert [(c.id, c.framework, c.turns) for c in conversations] == [("c1", FRAMEWORK, ("hi",))]


def test_the_gateway_offers_a_plugin_framework() -> None:
    with plugin_installed(STREAM_ONLY_PLUGIN, FRAMEWORK):
        options = framework_options().decode()
        enum = base_schema(framework_names(), default=DEFAULT_FRAMEWORK)["components"]["schemas"]["NewSession"]
    assert '<option value="stream_only">Stream only (test plugin)</option>' in options
    assert enum["properties"]["framework"]["enum"] == ["none", "langgraph", "plain_openai", FRAMEWORK]
    # Gone again with the plugin: the registry is the only list.
    assert "stream_only" not in framework_options().decode()
