"""`handlers.journal.Resumed.of`: where an attempt resumes, from a turn's journal entries (pure)."""

from __future__ import annotations

from handlers.journal import Resumed, Step, StepKind
from handlers.messages import AgentMessage

HIT = {"document_id": 1, "title": "Doc", "chunk_id": 3, "snippet": "s"}


def _model(seq: int, *ids: str, tokens: int = 5) -> Step:
    calls = [{"id": call_id, "name": "t", "args": {}} for call_id in ids]
    usage = {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
    message = AgentMessage(role="assistant", content="", tool_calls=calls)
    return Step(seq=seq, kind=StepKind.MODEL, attempt=1, message=message, usage=usage)


def _started(seq: int, call_id: str) -> Step:
    return Step(seq=seq, kind=StepKind.TOOL_STARTED, attempt=1, call_id=call_id, tool_name="t")


def _result(seq: int, call_id: str, text: str, hits: list[dict[str, object]] | None = None) -> Step:
    message = AgentMessage(role="tool", content=text, tool_call_id=call_id, citations=hits)
    return Step(seq=seq, kind=StepKind.TOOL_RESULT, attempt=1, call_id=call_id, message=message)


def test_no_steps_resume_nowhere() -> None:
    assert Resumed.of([]) == Resumed()


def test_finished_rounds_are_all_messages_and_their_usage_adds_up() -> None:
    resumed = Resumed.of([_model(1, "a"), _started(2, "a"), _result(3, "a", "A")])
    assert [m.role for m in resumed.messages] == ["assistant", "tool"]
    assert resumed.steps == 2 and resumed.pending == () and resumed.usage["prompt_tokens"] == 5


def test_an_open_round_leaves_its_results_to_be_produced_again_and_knows_the_unsure_calls() -> None:
    steps = [
        _model(1, "a"),
        _started(2, "a"),
        _result(3, "a", "A", [HIT]),
        _model(4, "b", "c", "d", tokens=7),
        _started(5, "b"),
        _result(6, "b", "B"),
        _started(7, "c"),
    ]
    resumed = Resumed.of(list(reversed(steps)))  # order comes from seq
    assert [(m.role, m.tool_call_id) for m in resumed.messages] == [
        ("assistant", None),
        ("tool", "a"),
        ("assistant", None),
    ]
    assert [call["id"] for call in resumed.pending] == ["b", "c", "d"]
    assert resumed.results == {"b": "B"} and resumed.started == frozenset({"c"})
    assert resumed.steps == 4 and resumed.usage["total_tokens"] == 6 + 8
    # The hits a search found come back for the citations; the stored tool message carries none.
    assert resumed.hits == (HIT,) and resumed.messages[1].citations is None
