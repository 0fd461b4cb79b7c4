"""Property-based fuzzing: malformed task payloads and CLI inputs never crash, never leak a
traceback, always explain themselves in one line, and store nothing for a rejected turn."""

from __future__ import annotations

import contextlib
import io
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from models.db import session_scope
from models.tables import ChatMessage, Turn
from tests.support.turns import wait_for_turn
from tests.support.workers import WorkerProcess
from worker.cli import main
from worker.errors import ChatqError, TurnFailed
from worker.producer import create_session, submit_turn

# 300 generated cases a property in `make test` (each of the 12 breakages ~25 times, a new draw on
# every run: no example database); CHATQ_FUZZ_EXAMPLES=1000 or more for a long look.
FUZZ = settings(
    max_examples=int(os.environ.get("CHATQ_FUZZ_EXAMPLES", "300")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@st.composite
def malformed_payload(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A valid message with at least one thing broken, so it is malformed by construction."""
    turn_id = str(uuid.uuid4())
    payload: dict[str, Any] = {
        "turn_id": turn_id,
        "session_id": str(uuid.uuid4()),
        "content": draw(st.text(min_size=1, max_size=50).filter(lambda s: s.strip() and "\x00" not in s)),
        "images": None,
        "reply_to": None,
    }
    breakage = draw(
        st.sampled_from(
            [
                "drop",
                "turn_id",
                "session_id",
                "content",
                "empty",
                "oversize",
                "nul",
                "surrogate",
                "images",
                "image_item",
                "reply_to",
                "id_mismatch",
            ]
        )
    )
    if breakage == "drop":
        # Not turn_id: a message without it runs under its task id (a plain Celery client's call).
        del payload[draw(st.sampled_from(["session_id", "content"]))]
    elif breakage in ("turn_id", "session_id"):
        payload[breakage] = draw(junk.filter(lambda v: not _is_uuid(v)))
    elif breakage == "content":
        payload["content"] = draw(junk.filter(lambda v: not isinstance(v, str)))
    elif breakage == "empty":
        payload["content"] = draw(st.text(alphabet=" \t\n", max_size=5))
    elif breakage == "oversize":
        payload["content"] = "x" * (100_001 + draw(st.integers(0, 50)))
    elif breakage == "nul":
        payload["content"] += "\x00"
    elif breakage == "surrogate":
        position = draw(st.integers(0, len(payload["content"])))
        lone = chr(draw(st.integers(0xD800, 0xDFFF)))
        payload["content"] = payload["content"][:position] + lone + payload["content"][position:]
    elif breakage == "images":
        payload["images"] = draw(
            st.one_of(
                st.text(max_size=10),
                st.integers(),
                st.dictionaries(st.text(max_size=3), st.text(max_size=3), min_size=1),
            )
        )
    elif breakage == "image_item":
        payload["images"] = [
            draw(
                st.one_of(
                    st.integers(),
                    st.text(max_size=20).filter(lambda s: not s.startswith(("http://", "https://", "data:image/"))),
                )
            )
        ]
    elif breakage == "reply_to":
        payload["reply_to"] = draw(
            st.one_of(
                st.text(max_size=5),
                st.booleans(),
                st.integers(max_value=0),
                st.integers(min_value=2**63, max_value=2**80),
                st.floats(),
            )
        )
    else:
        payload["turn_id"] = str(uuid.uuid4())
    return turn_id, payload


def _is_uuid(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _stored(turn_id: str) -> int:
    with session_scope() as db:
        tid = uuid.UUID(turn_id)
        turns = db.execute(select(func.count()).select_from(Turn).where(Turn.id == tid)).scalar_one()
        messages = db.execute(
            select(func.count()).select_from(ChatMessage).where(ChatMessage.turn_id == tid)
        ).scalar_one()
    return int(turns + messages)


@pytest.fixture(scope="module")
def fuzz_env(chatq_env: dict[str, str]) -> Iterator[dict[str, str]]:
    yield chatq_env


@FUZZ
@given(case=malformed_payload())
@pytest.mark.slow  # hundreds of generated cases
def test_the_task_rejects_malformed_payloads_and_stores_nothing(
    fuzz_env: dict[str, str], case: tuple[str, dict[str, Any]]
) -> None:
    from worker.runtime.intake.tasks import run_turn

    turn_id, payload = case
    result = run_turn.apply(kwargs=payload, task_id=turn_id)
    # Rejected: the task ends in FAILURE with the one-line reason, not with a crash.
    assert result.failed(), result.result
    assert isinstance(result.result, TurnFailed), result.traceback
    assert result.result.message.startswith("rejected: ") and "\n" not in result.result.message
    assert _stored(turn_id) == 0


@FUZZ
@given(
    content=st.one_of(junk, st.text(alphabet=" \n", max_size=3), st.just("x" * 100_001)).filter(
        lambda v: not (isinstance(v, str) and v.strip() and len(v) <= 100_000 and "\x00" not in v)
    ),
    images=st.one_of(st.none(), junk),
    reply_to=st.one_of(st.none(), junk),
)
@pytest.mark.slow  # hundreds of generated cases
def test_the_producer_refuses_malformed_input_with_one_line(
    fuzz_env: dict[str, str], content: Any, images: Any, reply_to: Any
) -> None:
    session_id = _fuzz_session()
    with pytest.raises(ChatqError) as info:
        submit_turn(session_id, content, images=images, reply_to=reply_to)
    assert info.value.message and "\n" not in info.value.message
    with session_scope() as db:
        assert db.execute(select(func.count()).select_from(Turn).where(Turn.session_id == session_id)).scalar_one() == 0


_sessions: dict[str, uuid.UUID] = {}


def _fuzz_session() -> uuid.UUID:
    if "id" not in _sessions:
        _sessions["id"] = create_session(framework="none", model="echo")
    return _sessions["id"]


cli_word = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["--json", "--turn", "--session", "--model", "--framework", "--if-busy", "--reply-to", "--image", "-h"]
    ),
    st.uuids().map(str),
)


@FUZZ
@given(
    command=st.sampled_from(
        [["show"], ["cancel"], ["usage"], ["submit"], ["session", "create"], ["session"], ["db"], ["nope"], []]
    ),
    words=st.lists(cli_word, max_size=4),
)
@pytest.mark.slow  # hundreds of generated cases
def test_the_cli_answers_any_input_with_an_exit_code_and_at_most_one_error_line(
    fuzz_env: dict[str, str], command: list[str], words: list[str]
) -> None:
    argv = command + words
    if "--follow" in argv or "-h" in argv or "--help" in argv:
        return
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    assert code in (0, 1, 2), (argv, code)
    assert "Traceback" not in err.getvalue()
    if code != 0:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("chatq: error: "), (argv, err.getvalue())


@pytest.mark.slow
def test_a_real_worker_survives_a_stream_of_malformed_messages(chatq_env: dict[str, str]) -> None:
    from worker.app import app

    cases = _examples(150)
    worker = WorkerProcess({**chatq_env, "CHATQ_MODEL": "echo"}, concurrency=4).start()
    try:
        for turn_id, payload in cases:
            app.send_task("chatq.run_turn", kwargs=payload, task_id=turn_id, queue="chatq")
        session_id = create_session(framework="none", model="echo")
        good = submit_turn(session_id, "still alive?")
        assert wait_for_turn(good.turn_id, timeout=60).status.value == "succeeded"
        assert worker.alive
        assert all(_stored(turn_id) == 0 for turn_id, _ in cases)
        assert "Traceback" not in worker.log()
    finally:
        worker.stop()


def _examples(count: int) -> list[tuple[str, dict[str, Any]]]:
    """Draw examples from the strategy deterministically (no hypothesis test runner needed)."""
    import random

    rng = random.Random(1234)
    collected: list[tuple[str, dict[str, Any]]] = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True)
    @given(case=malformed_payload())
    def collect(case: tuple[str, dict[str, Any]]) -> None:
        collected.append(case)

    collect()
    rng.shuffle(collected)
    return collected[:count]
