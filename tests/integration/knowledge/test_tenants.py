"""Knowledge bases belong to a tenant: another tenant can neither see, attach, search nor probe
them (its answers are those of a name that does not exist), and a turn reads only its session's
tenant's knowledge bases, whatever is attached. The operator (`chatq kb`, the admin) sees all.

Before tenants owned knowledge bases, any tenant's session attached any name and read its passages.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from chatq.settings import get_settings, reset_settings
from handlers.context import ToolContext, use_tool_context
from handlers.knowledge_search import search_tool
from models.db import session_scope
from models.errors import KnowledgeBaseNotFound
from models.knowledge import (
    add_files,
    attach_knowledge_bases,
    create_knowledge_base,
    list_knowledge_bases,
    session_knowledge_bases,
    set_knowledge_base_tenant,
)
from models.search import search
from models.tables import KnowledgeBase, SessionKnowledgeBase
from models.turn_store import PostgresTurnStore
from tests.support.cli import chatq_here
from tests.support.env import environ
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import build_runtime
from tests.support.knowledge import REFUNDS
from tests.support.openai_stub import OpenAIStub
from tests.support.turns import turn_messages
from worker.history import get_session
from worker.payload import INTERACTIVE_QUEUE, parse_turn_request
from worker.producer import create_session, update_session
from worker.runtime.delivery.runner import Outcome, execute_turn

pytestmark = pytest.mark.usefixtures("chatq_env")

SECRET = "within 14 days"
"""Words of acme's document that no other tenant may ever read."""


@pytest.fixture
def tenants() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"acme-{suffix}", f"globex-{suffix}"


@pytest.fixture
def acme_kb(tmp_path: Path, tenants: tuple[str, str]) -> str:
    """A knowledge base of the first tenant holding the refund policy."""
    name = f"acme-docs-{uuid.uuid4().hex[:8]}"
    create_knowledge_base(name, tenant=tenants[0])
    (tmp_path / "refunds.md").write_text(REFUNDS, encoding="utf-8")
    add_files(name, [tmp_path / "refunds.md"])
    return name


def _unknown(call: object, name: str, *args: object, **kwargs: object) -> str:
    """The KnowledgeBaseNotFound message of `call(...)`, the name replaced by NAME."""
    assert callable(call)
    with pytest.raises(KnowledgeBaseNotFound) as info:
        call(*args, **kwargs)
    return info.value.message.replace(name, "NAME")


def _attach_raw(session_id: uuid.UUID, kb_name: str) -> None:
    """Attach as the database may hold it: from before knowledge bases had tenants, or before a move."""
    with session_scope() as db:
        kb_id = db.execute(select(KnowledgeBase.id).where(KnowledgeBase.name == kb_name)).scalar_one()
        db.execute(insert(SessionKnowledgeBase).values(session_id=session_id, knowledge_base_id=kb_id))


def test_another_tenants_knowledge_base_answers_as_a_name_that_does_not_exist(
    acme_kb: str, tenants: tuple[str, str]
) -> None:
    acme, globex = tenants
    nowhere = f"nowhere-{uuid.uuid4().hex[:8]}"
    mine = create_session(framework="none", model="echo", tenant=acme)
    theirs = create_session(framework="none", model="echo", tenant=globex)
    untenanted = create_session(framework="none", model="echo")

    assert attach_knowledge_bases(mine, [acme_kb]) == [acme_kb]
    # Attach (PATCH /sessions/{id}), create with it, search it: as if it did not exist.
    foreign = _unknown(attach_knowledge_bases, acme_kb, theirs, [acme_kb])
    assert foreign == _unknown(attach_knowledge_bases, nowhere, theirs, [nowhere])
    foreign = _unknown(update_session, acme_kb, theirs, knowledge_bases=[acme_kb], tenant=globex)
    assert foreign == _unknown(update_session, nowhere, theirs, knowledge_bases=[nowhere], tenant=globex)
    assert foreign == f"unknown knowledge base: NAME (create one with `chatq kb create NAME --tenant {globex}`)"
    foreign = _unknown(
        create_session, acme_kb, framework="none", model="echo", knowledge_bases=[acme_kb], tenant=globex
    )
    assert foreign == _unknown(
        create_session, nowhere, framework="none", model="echo", knowledge_bases=[nowhere], tenant=globex
    )
    foreign = _unknown(search, acme_kb, [acme_kb], "refunds", session_id=theirs)
    assert foreign == _unknown(search, nowhere, [nowhere], "refunds", session_id=theirs)
    # A session without a tenant (an admin's, the CLI's) uses the operator's knowledge bases only.
    _unknown(attach_knowledge_bases, acme_kb, untenanted, [acme_kb])
    assert session_knowledge_bases(theirs) == [] and session_knowledge_bases(untenanted) == []
    assert SECRET in search([acme_kb], "refunds", session_id=mine)[0].content

    # The operator sees every tenant's, and can list one tenant's.
    assert acme_kb in [info.name for info in list_knowledge_bases()]
    assert [info.name for info in list_knowledge_bases(acme)] == [acme_kb]
    assert list_knowledge_bases(globex) == []
    assert next(info for info in list_knowledge_bases() if info.name == acme_kb).to_dict()["tenant"] == acme


def test_an_attachment_to_another_tenants_knowledge_base_is_never_read(acme_kb: str, tenants: tuple[str, str]) -> None:
    acme, globex = tenants
    theirs = create_session(framework="none", model="echo", tenant=globex)
    _attach_raw(theirs, acme_kb)
    assert session_knowledge_bases(theirs) == []
    assert get_session(theirs, tenant=globex)["knowledge_bases"] == []
    # A tool context naming it (a worker's claim from before a move) still reads nothing of it.
    names = (acme_kb,)
    context = ToolContext(session_id=theirs, knowledge_bases=names, search=PostgresTurnStore().searcher(theirs, names))
    with use_tool_context(context), pytest.raises(KnowledgeBaseNotFound):
        search_tool("refunds")
    assert context.retrieved.hits() == []

    # Given to globex, the same attachment serves globex's session, and no longer acme's.
    mine = create_session(framework="none", model="echo", tenant=acme, knowledge_bases=[acme_kb])
    assert set_knowledge_base_tenant(acme_kb, globex).tenant == globex
    assert session_knowledge_bases(theirs) == [acme_kb]
    assert session_knowledge_bases(mine) == []


@pytest.fixture
def runtime(openai_stub: OpenAIStub) -> Iterator[OpenAIStub]:
    openai_stub.clear()
    with environ(OPENAI_BASE_URL=openai_stub.base_url, OPENAI_API_KEY=STUB_API_KEY, CHATQ_RETRY_DELAY="0"):
        reset_settings()
        yield openai_stub
    reset_settings()


@pytest.mark.parametrize("framework", ["langgraph", "none"])
def test_a_turn_reads_only_its_own_tenants_knowledge_bases(
    runtime: OpenAIStub, acme_kb: str, tenants: tuple[str, str], framework: str
) -> None:
    acme, globex = tenants
    key = uuid.uuid4().hex
    theirs = create_session(framework=framework, model="gpt-4o-mini", tenant=globex)
    _attach_raw(theirs, acme_kb)
    mine = create_session(framework=framework, model="gpt-4o-mini", tenant=acme, knowledge_bases=[acme_kb])
    for session, reads in ((theirs, False), (mine, True)):
        content = f"How long do refunds take? [quote] {key}"
        request = parse_turn_request(
            {"session_id": str(session), "content": content}, task_id=str(uuid.uuid4()), settings=get_settings()
        )
        result = execute_turn(request, queue=INTERACTIVE_QUEUE, worker="in-process@test", runtime=build_runtime())
        assert result.outcome is Outcome.SUCCEEDED, result
        sent = json.dumps([body for body in runtime.requests if key in json.dumps(body)])
        stored = json.dumps([(m.content, m.citations) for m in turn_messages(request.turn_id)])
        assert (SECRET in sent, SECRET in stored) == (reads, reads), (session, reads)
        runtime.clear()


def test_the_cli_gives_knowledge_bases_to_tenants(chatq_env: dict[str, str], tenants: tuple[str, str]) -> None:
    acme, _ = tenants
    name = f"cli-{uuid.uuid4().hex[:8]}"
    created = chatq_here(chatq_env, "kb", "create", name, "--tenant", acme)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == f"knowledge base {name!r} created for tenant {acme}"
    listed = chatq_here(chatq_env, "kb", "list", "--tenant", acme, "--json")
    assert [(kb["name"], kb["tenant"]) for kb in json.loads(listed.stdout)] == [(name, acme)]
    session = create_session(framework="none", model="echo")
    refused = chatq_here(chatq_env, "kb", "attach", str(session), name)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert f"knowledge base {name!r} belongs to tenant {acme}, not to the session's tenant" in refused.stderr
    moved = chatq_here(chatq_env, "kb", "tenant", name)
    assert moved.returncode == 0 and moved.stdout.strip() == f"knowledge base {name!r} belongs to no tenant"
    with session_scope() as db:
        assert db.execute(select(KnowledgeBase.tenant).where(KnowledgeBase.name == name)).scalar_one() is None
    attached = chatq_here(chatq_env, "kb", "attach", str(session), name)
    assert attached.returncode == 0, attached.stderr
