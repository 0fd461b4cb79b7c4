"""Knowledge-base pieces that need no database: chunking, titles, citations, prompts, tools, prices."""

from __future__ import annotations

import os
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from handlers.accounting import PriceTable, load_prices, parse_prices
from handlers.context import ToolContext, current_tool_context, current_turn, running_turn, use_tool_context
from handlers.knowledge import choose_citations, format_hits
from handlers.prompts import build_system_prompt
from handlers.tools import KNOWLEDGE_BASE_TOOL, default_tool_names, run_tool, session_tool_names
from models.documents import chunk_text, document_title
from models.search import SearchHit
from worker.errors import ConfigError


def test_paragraphs_are_packed_up_to_the_size() -> None:
    text = "\n\n".join(f"Paragraph {i} " + "word " * 20 for i in range(6))
    chunks = chunk_text(text, max_chars=300)
    assert all(len(c) <= 300 for c in chunks)
    assert len(chunks) == 3  # two ~125-char paragraphs per chunk
    assert " ".join(" ".join(chunks).split()) == " ".join(text.split())  # nothing lost or reordered


def test_a_heading_starts_a_new_chunk_and_stays_with_its_text() -> None:
    text = "# Title\n\nIntro.\n\n## Section A\n\nText of A.\n\n## Section B\n\nText of B."
    assert chunk_text(text) == ["# Title\n\nIntro.", "## Section A\n\nText of A.", "## Section B\n\nText of B."]


def test_long_paragraphs_are_cut_at_sentences_then_words() -> None:
    sentence = "This sentence has exactly eight words in it. "
    chunks = chunk_text(sentence * 30, max_chars=100)
    assert all(len(c) <= 100 for c in chunks)
    assert all(c.endswith(".") for c in chunks)
    word = "x" * 250
    assert chunk_text(word, max_chars=100) == ["x" * 100, "x" * 100, "x" * 50]
    assert chunk_text("  \n\n \r\n ") == []


def test_titles() -> None:
    assert document_title(Path("/k/refunds.md"), "intro\n\n# Refund  policy #\n\ntext") == "Refund policy"
    assert document_title(Path("/k/refunds.md"), "no heading") == "refunds"
    assert document_title(Path("/k/notes.txt"), "# Not markdown here") == "notes"


def _hit(document_id: int, title: str, chunk_id: int) -> dict[str, object]:
    return {"document_id": document_id, "title": title, "chunk_id": chunk_id, "snippet": f"snippet {chunk_id}"}


def test_citations_are_the_documents_the_answer_names() -> None:
    context = ToolContext(session_id=uuid.uuid4(), knowledge_bases=("kb",))
    assert choose_citations(context, "anything") is None
    context.retrieved.add([_hit(1, "Refund policy", 10), _hit(1, "Refund policy", 11), _hit(2, "Shipping times", 20)])
    context.retrieved.add([_hit(2, "Shipping times", 20)])  # found again: kept once
    assert [c["chunk_id"] for c in choose_citations(context, "Per the refund POLICY, 14 days.") or []] == [10, 11]
    assert [c["chunk_id"] for c in choose_citations(context, "See document 2.") or []] == [20]
    # An answer that names no document was still based on what the search found.
    assert [c["chunk_id"] for c in choose_citations(context, "14 days.") or []] == [10, 11, 20]


def test_tool_results_show_each_passage_with_its_title() -> None:
    hit = SearchHit(
        chunk_id=7,
        document_id=3,
        title="Refund policy",
        position=0,
        content="Refunds take 14 days.",
        snippet="**Refunds** take",
        rank=0.1,
        all_terms=True,
    )
    text = format_hits("refunds?", [hit])
    assert '1 passage from the knowledge base for "refunds?"' in text
    assert "[1] Refund policy (document 3)\nRefunds take 14 days." in text
    assert format_hits("x", []) == 'No passage of the knowledge base matches "x".'


def test_the_search_tool_is_bound_exactly_with_knowledge_bases() -> None:
    assert KNOWLEDGE_BASE_TOOL not in default_tool_names()
    assert KNOWLEDGE_BASE_TOOL not in session_tool_names(None)
    assert session_tool_names(None, ["kb"])[-1] == KNOWLEDGE_BASE_TOOL
    # Even a session that lists it gets it only with a knowledge base attached.
    assert session_tool_names(["calculator", KNOWLEDGE_BASE_TOOL]) == ("calculator",)
    assert session_tool_names(["calculator"], ["kb"]) == ("calculator", KNOWLEDGE_BASE_TOOL)


def test_the_search_tool_without_a_knowledge_base_is_an_error_result() -> None:
    assert run_tool(KNOWLEDGE_BASE_TOOL, {"query": "x"}).startswith("Error: No knowledge base is attached")
    context = ToolContext(session_id=None, knowledge_bases=())
    assert run_tool(KNOWLEDGE_BASE_TOOL, {"query": "x"}, context=context).startswith("Error: No knowledge base")


def test_contexts_are_scoped() -> None:
    assert current_turn() is None and current_tool_context() is None
    turn_id = uuid.uuid4()
    with running_turn(turn_id, 2):
        context = ToolContext.for_session(type("S", (), {"id": str(uuid.uuid4())})())
        assert context.turn is not None and (context.turn.turn_id, context.turn.attempt) == (turn_id, 2)
        call = context.for_call("c1")
        assert call.invocation_id == context.invocation_id and call.retrieved is context.retrieved
        with use_tool_context(call):
            assert current_tool_context() is call
        assert current_tool_context() is None
    assert current_turn() is None


def test_prompt_for_a_handler_that_searched_itself() -> None:
    prompt = build_system_prompt(None, knowledge_bases=["support"], knowledge_results="[1] Refund policy ...")
    assert "already been searched" in prompt and "do not call the search tool" not in prompt
    assert prompt.endswith("Knowledge base search results for the user's latest message:\n\n[1] Refund policy ...")
    with_tool = build_system_prompt(None, tools=[KNOWLEDGE_BASE_TOOL], knowledge_bases=["support"])
    assert "search the knowledge base first" in with_tool


def test_price_tables() -> None:
    table = parse_prices('{"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}')
    assert table.token_cost("gpt-4o-mini", 1_000_000, 2_000_000) == Decimal("1.35")
    assert table.token_cost("openai/gpt-4o-mini", 1_000_000, 0) == Decimal("0.15")
    assert table.token_cost("unknown", 1, 1) is None
    assert table.token_cost("echo", 10, 10) == 0
    full = parse_prices(
        '{"models": {"m": {"prompt": 1, "completion": 2}}, '
        '"tools": {"search_knowledge_base": 0.002}, "currency": "EUR"}'
    )
    assert full.tool_price("search_knowledge_base") == Decimal("0.002")
    assert full.tool_price("other", 0.5) == Decimal("0.5")
    assert full.currency == "EUR"
    assert load_prices("") == PriceTable()


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"m": {"prompt": 1}}', 'needs "prompt" and "completion"'),
        ('{"models": {}, "extra": 1}', "unknown keys extra"),
        ('{"tools": {"t": -1}}', "at least 0"),
        ('{"tools": {"t": "cheap"}}', "must be a number"),
    ],
)
def test_bad_price_tables_are_one_clear_line(raw: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        parse_prices(raw)
    assert "\n" not in info.value.message


def test_price_table_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"tools": {"t": 0.25}}')
    assert load_prices(str(path)).tool_price("t") == Decimal("0.25")
    path.write_text('{"tools": {"t": 0.5}}')
    os.utime(path, ns=(1, 2))  # a different mtime: the file is read again
    assert load_prices(str(path)).tool_price("t") == Decimal("0.5")
    with pytest.raises(ConfigError, match="neither a JSON object nor a readable file"):
        load_prices(str(tmp_path / "missing.json"))
