"""How a re-run classifies a conversation against what its batch stored (the pure comparison)."""

from __future__ import annotations

import uuid

from models.tables import TurnStatus
from worker.cli.batch import Conversation, turn_uuid
from worker.cli.batch_resume import Found, StoredConversation, StoredTurn, compare

BATCH = "unit-batch"


def conversation(*turns: str, framework: str = "none", model: str | None = None) -> Conversation:
    return Conversation(line=4, id="c", framework=framework, model=model, system_prompt=None, turns=turns)


def stored(*texts: str, framework: str = "none", extra_turns: int = 0, finished: int = 0) -> StoredConversation:
    turns = tuple(
        StoredTurn(
            id=turn_uuid(BATCH, "c", index),
            status=TurnStatus.SUCCEEDED if index < finished else TurnStatus.QUEUED,
            content=text,
        )
        for index, text in enumerate(texts)
    )
    return StoredConversation(
        framework=framework,
        model="gpt-4o-mini",
        system_prompt=None,
        next_position=len(texts) + extra_turns,
        turns=turns,
    )


def turn_id(index: int) -> uuid.UUID:
    return turn_uuid(BATCH, "c", index)


def test_the_same_turns_resume() -> None:
    result = compare(conversation("a", "b"), stored("a", "b", finished=1), turn_id)
    assert (result.found, result.stored_turns, result.finished_turns) == (Found.UNCHANGED, 2, 1)


def test_turns_added_at_the_end_are_appended() -> None:
    assert compare(conversation("a", "b", "c"), stored("a", "b"), turn_id).found is Found.APPENDED


def test_every_other_edit_is_a_change_that_says_what() -> None:
    changed = compare(conversation("a", "B", "C"), stored("a", "b", "c"), turn_id)
    assert changed.found is Found.CHANGED
    assert changed.reason == "turns[1], turns[2] differ from the stored text"
    assert str(changed) == (
        "line 4: conversation 'c' changed since this batch stored it "
        "(turns[1], turns[2] differ from the stored text); not run"
    )
    assert compare(conversation("a"), stored("a", "b"), turn_id).reason == "1 turn(s) removed: 2 were stored"
    assert compare(conversation("a", framework="langgraph"), stored("a"), turn_id).reason == (
        "session.framework was 'none'"
    )
    assert compare(conversation("a", model="other"), stored("a"), turn_id).reason == "session.model was 'gpt-4o-mini'"
    # A conversation without a model in the file took the default of its day: not an edit.
    assert compare(conversation("a"), stored("a"), turn_id).found is Found.UNCHANGED


def test_a_session_with_turns_from_elsewhere_is_not_appended_to() -> None:
    result = compare(conversation("a", "b"), stored("a", extra_turns=1), turn_id)
    assert (result.found, result.reason) == (Found.CHANGED, "its session holds turns this batch did not submit")
