"""The worker's environment decides a session's default model, and a model without its key fails at once.

A session created without a model stores none (NULL) and runs on the default model of the worker
that runs the turn, whichever producer created it: the Python API, `chatq session create`, a batch
file, the HTTP gateway, or a raw task message naming an unknown session. The producers here run
with no OpenAI key, base URL or CHATQ_MODEL, as in a newcomer's terminal; the worker has them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from models.db import session_scope
from models.tables import ChatSession, Turn
from tests.integration.gateway.conftest import TOKEN, GatewayProcess
from tests.support.cli import chatq, chatq_here
from tests.support.env import environ
from tests.support.factories import add_turn, assistant, user
from tests.support.fixtures import STUB_API_KEY
from tests.support.inprocess import in_process_worker
from tests.support.openai_stub import OpenAIStub, message_text
from tests.support.turns import replay_events, turn_messages, wait_for_turn, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.dispatch import send_turn
from worker.events import get_redis
from worker.payload import task_message
from worker.producer import create_session, submit_turn
from worker.queries import WORKER_DEFAULT, format_usage, usage_report

WORKER_MODEL = "the-workers-own-model"
"""CHATQ_MODEL of the worker: a name no producer's environment could have chosen."""

NO_MODEL_CONFIG = {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": "", "CHATQ_MODEL": ""}
"""A terminal (or a worker) without any model configuration: its own default would be `echo`."""

KEYLESS = "Model 'gpt-4o-mini' needs OPENAI_API_KEY or OPENAI_BASE_URL; use the 'echo' model to run offline."


@pytest.fixture
def terminal() -> Iterator[dict[str, str]]:
    """This process (and the `chatq` commands it runs) without OpenAI settings."""
    with environ(**NO_MODEL_CONFIG):
        yield NO_MODEL_CONFIG


def _model_asked_for(stub: OpenAIStub, text: str) -> list[str]:
    """The model named by each request the stub got whose messages include `text`."""
    return [
        str(body.get("model"))
        for body in stub.requests
        if any(text in message_text(message) for message in body.get("messages") or [])
    ]


def _stored_model(session_id: uuid.UUID) -> str | None:
    with session_scope() as db:
        row = db.get(ChatSession, session_id)
        assert row is not None
        return row.model


@pytest.mark.slow  # a real worker, `chatq serve` and `chatq batch`
def test_every_producer_path_runs_on_the_workers_default_model(
    chatq_env: dict[str, str], openai_stub: OpenAIStub, terminal: dict[str, str], tmp_path: Path
) -> None:
    worker = WorkerProcess(
        {
            **chatq_env,
            "CHATQ_MODEL": WORKER_MODEL,
            "OPENAI_BASE_URL": openai_stub.base_url,
            "OPENAI_API_KEY": STUB_API_KEY,
        }
    ).start()
    gateway = GatewayProcess({**chatq_env, **terminal, "CHATQ_API_TOKEN": TOKEN}).wait_ready()
    try:
        tag = uuid.uuid4().hex[:8]
        texts: dict[str, str] = {}
        sessions: dict[str, uuid.UUID] = {}
        turn_ids: list[uuid.UUID] = []

        def submit(path: str, session_id: uuid.UUID) -> None:
            texts[path] = f"{path} {tag}"
            sessions[path] = session_id
            turn_ids.append(submit_turn(session_id, texts[path]).turn_id)

        submit("python", create_session(framework="none"))

        created = chatq({**chatq_env, **terminal}, "session", "create", "--json")
        assert created.returncode == 0, created.stderr
        assert created.stderr == ""  # no model chosen: nothing to warn about
        submit("cli", uuid.UUID(json.loads(created.stdout)["session_id"]))

        with httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
            answer = api.post("/sessions", json={"framework": "plain_openai"})
        assert answer.status_code == 201, answer.text
        submit("gateway", uuid.UUID(answer.json()["session_id"]))

        # A plain Celery message naming a session nobody created: the worker creates it.
        raw_turn, raw_session = uuid.uuid4(), uuid.uuid4()
        texts["raw"], sessions["raw"] = f"raw {tag}", raw_session
        message = task_message(
            turn_id=raw_turn, session_id=raw_session, content=texts["raw"], images=None, reply_to=None
        )
        assert send_turn(message, queue="chatq", client=get_redis())
        turn_ids.append(raw_turn)

        rows = wait_for_turns(turn_ids)
        assert all(row.status.value == "succeeded" for row in rows.values()), [r.error for r in rows.values()]

        texts["batch"] = f"batch {tag}"
        source, out = tmp_path / "batch.jsonl", tmp_path / "results.jsonl"
        source.write_text(json.dumps({"id": "c1", "session": {"framework": "langgraph"}, "turns": [texts["batch"]]}))
        batch = chatq({**chatq_env, **terminal}, "batch", str(source), "--out", str(out))
        assert batch.returncode == 0, batch.stderr
        record = json.loads(out.read_text())
        assert [turn["status"] for turn in record["turns"]] == ["succeeded"]
        sessions["batch"] = uuid.UUID(record["session_id"])

        for path, text in texts.items():
            assert _model_asked_for(openai_stub, text) == [WORKER_MODEL], path
            assert _stored_model(sessions[path]) is None, path
    finally:
        gateway.stop()
        worker.stop()


def test_a_model_the_worker_has_no_key_for_fails_its_turn_once(
    chatq_env: dict[str, str], openai_stub: OpenAIStub, redis_url: str, terminal: dict[str, str]
) -> None:
    # Turns run in this process under the worker's environment (tests/support/inprocess.py); that a
    # real worker's environment is the one that counts, the first test of this module shows.
    with in_process_worker(redis_url, **NO_MODEL_CONFIG):
        keyed = create_session(framework="langgraph", model="gpt-4o-mini")
        unnamed = create_session(framework="langgraph")
        text = f"needs a key {uuid.uuid4().hex[:8]}"
        bad = submit_turn(keyed, text)
        good = submit_turn(unnamed, "offline is fine")

        row = wait_for_turn(bad.turn_id, timeout=30)
        assert row.status.value == "failed"
        assert row.attempts == 1
        assert row.error == KEYLESS
        assert [e["type"] for e in replay_events(redis_url, bad.turn_id)] == ["queued", "started", "error"]
        assert _model_asked_for(openai_stub, text) == []
        assert [m.role for m in turn_messages(bad.turn_id)] == ["user"]

        # The same worker runs a session that names no model on its own default: echo, offline.
        assert wait_for_turn(good.turn_id, timeout=30).status.value == "succeeded"
        assert [m.content for m in turn_messages(good.turn_id)] == ["offline is fine", "offline is fine"]


def test_session_create_warns_when_this_terminal_lacks_the_models_key(
    chatq_env: dict[str, str], terminal: dict[str, str]
) -> None:
    env = {**chatq_env, **terminal}
    result = chatq_here(env, "session", "create", "--model", "gpt-4o-mini")
    assert result.returncode == 0, result.stderr
    session_id = uuid.UUID(result.stdout.strip())
    assert _stored_model(session_id) == "gpt-4o-mini"
    warning = result.stderr
    assert warning.startswith("chatq: warning: model 'gpt-4o-mini' needs OPENAI_API_KEY or OPENAI_BASE_URL")
    assert "the worker's environment is what counts" in warning
    assert warning.count("\n") == 1

    offline = chatq_here(env, "session", "create", "--model", "echo")
    assert offline.returncode == 0 and offline.stderr == ""
    with_url = chatq_here({**env, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, "session", "create", "--model", "gpt-4o")
    assert with_url.returncode == 0 and with_url.stderr == ""


def test_usage_shows_sessions_without_a_model_as_the_worker_default(chatq_env: dict[str, str]) -> None:
    session_id = create_session()
    turn = add_turn(session_id, [user("q"), assistant("a")])
    with session_scope() as db:
        db.execute(update(Turn).where(Turn.id == turn.id).values(prompt_tokens=3, completion_tokens=4, total_tokens=7))
    report = usage_report(session_id)
    (row,) = report["by_model"]
    assert (row["model"], row["turns"], row["total_tokens"], row["estimated_cost"]) == (None, 1, 7, None)
    assert report["unpriced_models"] == [WORKER_DEFAULT]
    assert format_usage(report)[1].split() == ["(worker", "default)", "1", "3", "4", "7", "-"]
