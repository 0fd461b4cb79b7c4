"""`chatq usage`: token totals as before, plus paid tool costs and estimated costs from the price table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import update

from chatq.settings import get_settings, reset_settings
from handlers.accounting import record_tool_call
from models.db import session_scope
from models.tables import ChatSession, Turn
from tests.support.factories import add_turn, assistant, create_session, user
from tests.support.workers import ROOT
from worker.errors import BatchNotFound, ConfigError
from worker.queries import format_usage, usage_report

pytestmark = pytest.mark.usefixtures("chatq_env")

PRICES = (
    '{"models": {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}, '
    '"tools": {"search_knowledge_base": 0.002}, "currency": "USD"}'
)


@contextmanager
def prices(value: str | None) -> Iterator[None]:
    saved = os.environ.get("CHATQ_PRICES")
    if value is None:
        os.environ.pop("CHATQ_PRICES", None)
    else:
        os.environ["CHATQ_PRICES"] = value
    reset_settings()  # CHATQ_PRICES is read through the settings
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CHATQ_PRICES", None)
        else:
            os.environ["CHATQ_PRICES"] = saved
        reset_settings()


def _report(session_id: uuid.UUID | None = None, *, batch: str | None = None) -> dict[str, Any]:
    """`usage_report` with the prices handed in as `chatq usage` hands them: its settings' CHATQ_PRICES."""
    return usage_report(session_id, batch=batch, prices=get_settings().prices)


def _turn(session_id: uuid.UUID, prompt: int, completion: int) -> uuid.UUID:
    ref = add_turn(session_id, [user("q"), assistant("a")])
    with session_scope() as db:
        db.execute(
            update(Turn)
            .where(Turn.id == ref.id)
            .values(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        )
    return ref.id


def _session(model: str, batch: str | None = None) -> uuid.UUID:
    session_id = create_session(model=model)
    if batch is not None:
        with session_scope() as db:
            db.execute(update(ChatSession).where(ChatSession.id == session_id).values(metadata_={"batch": batch}))
    return session_id


def _search(session_id: uuid.UUID, turn_id: uuid.UUID | None, call: str, invocation: uuid.UUID) -> bool:
    return record_tool_call(
        tool_name="search_knowledge_base",
        tool_call_id=call,
        invocation_id=invocation,
        session_id=session_id,
        turn_id=turn_id,
        attempt=1,
    )


def test_a_session_report_has_tokens_tool_costs_and_an_estimate() -> None:
    session_id = _session("gpt-4o-mini")
    first = _turn(session_id, 1_000_000, 100_000)
    _turn(session_id, 500_000, 0)
    invocation = uuid.uuid4()
    with prices(PRICES):
        assert _search(session_id, first, "c1", invocation)
        assert _search(session_id, first, "c2", invocation)
        assert not _search(session_id, first, "c1", invocation)  # the same call: recorded once
        report = _report(session_id)
    # The keys chatq usage always had, unchanged.
    assert report["session_id"] == str(session_id)
    assert (report["turns"], report["prompt_tokens"], report["completion_tokens"]) == (2, 1_500_000, 100_000)
    assert report["total_tokens"] == 1_600_000
    (row,) = report["by_model"]
    assert {k: row[k] for k in ("model", "turns", "prompt_tokens", "completion_tokens", "total_tokens")} == {
        "model": "gpt-4o-mini",
        "turns": 2,
        "prompt_tokens": 1_500_000,
        "completion_tokens": 100_000,
        "total_tokens": 1_600_000,
    }
    # What is new: costs.
    assert row["estimated_cost"] == pytest.approx(1.5 * 0.15 + 0.1 * 0.6)
    assert report["by_tool"] == [{"tool": "search_knowledge_base", "calls": 2, "units": 2, "cost": 0.004}]
    assert (report["tool_calls"], report["tool_cost"]) == (2, 0.004)
    assert report["token_cost"] == pytest.approx(0.285)
    assert report["estimated_cost"] == pytest.approx(0.289)
    assert report["unpriced_models"] == [] and report["currency"] == "USD"

    lines = format_usage(report)
    assert lines[0].split() == ["model", "turns", "prompt", "completion", "total", "cost", "USD"]
    assert lines[1].split() == ["gpt-4o-mini", "2", "1500000", "100000", "1600000", "0.285000"]
    assert ["search_knowledge_base", "2", "2", "0.004000"] in [line.split() for line in lines]
    assert lines[-1] == "estimated cost: 0.289000 USD"


def test_costs_are_kept_as_they_were_when_the_call_was_made() -> None:
    session_id = _session("echo")
    with prices('{"tools": {"search_knowledge_base": 0.5}}'):
        _search(session_id, None, "old", uuid.uuid4())
    with prices('{"tools": {"search_knowledge_base": 1}}'):
        _search(session_id, None, "new", uuid.uuid4())
        report = _report(session_id)
    assert report["tool_cost"] == 1.5
    assert report["token_cost"] == 0.0  # no turns; echo is free anyway


def test_models_without_a_price_are_listed() -> None:
    session_id = _session("mystery-model")
    _turn(session_id, 10, 5)
    with prices(None):
        report = _report(session_id)
    assert report["by_model"][0]["estimated_cost"] is None
    assert report["unpriced_models"] == ["mystery-model"]
    # Nothing has a price: no cost, not a cost of zero.
    assert (report["token_cost"], report["estimated_cost"]) == (None, None)
    lines = format_usage(report)
    assert lines[-3].split()[:2] == ["all", "1"] and lines[-3].split()[-1] == "-", "no cost on the all row"
    assert lines[-1] == "estimated cost: none, no price for: mystery-model (set CHATQ_PRICES)"

    # Partly priced: the estimate says it covers the priced part only.
    with prices(PRICES):
        _search(session_id, None, "c", uuid.uuid4())  # a paid call costs what it cost when made
        lines = format_usage(_report(session_id))
    assert lines[-2:] == [
        "estimated cost: 0.002000 USD for the priced part only",
        "no price for: mystery-model (set CHATQ_PRICES)",
    ]


def test_the_cli_says_when_nothing_has_a_price(capsys: pytest.CaptureFixture[str]) -> None:
    from worker.cli.commands import main

    session_id = _session("mystery-model")
    _turn(session_id, 10, 5)
    with prices(None):
        assert main(["usage", "--session", str(session_id)]) == 0
        out = capsys.readouterr().out
        assert main(["usage", "--session", str(session_id), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    assert "0.000000" not in out
    assert out.splitlines()[-1] == "estimated cost: none, no price for: mystery-model (set CHATQ_PRICES)"
    assert (report["estimated_cost"], report["unpriced_models"]) == (None, ["mystery-model"])


def test_a_batch_report_covers_its_sessions_only() -> None:
    batch = f"batch-{uuid.uuid4().hex[:8]}"
    inside, outside = _session("gpt-4o-mini", batch), _session("gpt-4o-mini")
    _search(inside, _turn(inside, 100, 10), "a", uuid.uuid4())
    _search(outside, _turn(outside, 999, 99), "b", uuid.uuid4())
    with prices(PRICES):
        report = _report(batch=batch)
    assert (report["batch"], report["turns"], report["prompt_tokens"], report["tool_calls"]) == (batch, 1, 100, 1)


def test_an_unknown_batch_is_an_error_like_an_unknown_session(capsys: pytest.CaptureFixture[str]) -> None:
    from worker.cli.commands import main

    unknown_session, unknown_batch = uuid.uuid4(), f"nosuch-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BatchNotFound):
        _report(batch=unknown_batch)
    for args, error in (
        (["--session", str(unknown_session)], f"session {unknown_session} does not exist"),
        (["--batch", unknown_batch], f"batch {unknown_batch!r} does not exist (no session belongs to it)"),
        (["--batch", unknown_batch, "--json"], f"batch {unknown_batch!r} does not exist (no session belongs to it)"),
    ):
        assert main(["usage", *args]) == 1, args
        assert capsys.readouterr() == ("", f"chatq: error: {error}\n")
    # A batch whose sessions have no turns yet exists: zeros, exit 0.
    batch = f"batch-{uuid.uuid4().hex[:8]}"
    _session("gpt-4o-mini", batch)
    assert main(["usage", "--batch", batch, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["turns"] == 0


def test_a_bad_price_table_is_a_one_line_error(chatq_env: dict[str, str]) -> None:
    with prices("{oops"), pytest.raises(ConfigError, match="CHATQ_PRICES is not valid JSON"):
        _report()
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "usage", "--json"],
        cwd=ROOT,
        env={**os.environ, **chatq_env, "CHATQ_PRICES": "/nonexistent/prices.json"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "chatq: error: CHATQ_PRICES is neither a JSON object nor a readable file: /nonexistent/prices.json"
    )
