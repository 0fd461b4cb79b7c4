from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import event, update

from handlers.history import History, trim_history
from handlers.tokens import count_message_tokens, count_tokens
from models.db import get_engine, session_scope
from models.errors import NotAUserMessage
from models.history import session_history
from models.tables import Turn, TurnStatus
from tests.support.env import environ
from tests.support.factories import (
    Msg,
    TurnRef,
    add_many_turns,
    add_turn,
    assistant,
    create_session,
    tool,
    user,
)

pytestmark = pytest.mark.usefixtures("chatq_env")

KEYS = {"role", "content", "tool_calls", "tool_call_id"}


def ref(session_id: uuid.UUID) -> SimpleNamespace:
    """What session_history needs of a session: its id."""
    return SimpleNamespace(id=session_id)


def build_history(
    session: Any, reply_to: int | None = None, prompt: str = "", *, budget_tokens: int | None = None
) -> History:
    """The store's rows (models.history) cut by the pure trimming (handlers.history), as a plain handler does."""
    with session_history(session, reply_to) as pages:
        return trim_history(pages, prompt, budget_tokens=budget_tokens)


def as_dicts(messages: Sequence[Msg]) -> list[dict[str, Any]]:
    return [
        {"role": m.role, "content": m.content, "tool_calls": m.tool_calls, "tool_call_id": m.tool_call_id}
        for m in messages
    ]


def cost(messages: Sequence[Msg]) -> int:
    return sum(count_message_tokens(d) for d in as_dicts(messages))


def exchange(n: int) -> list[Msg]:
    return [user(f"topic {n}: tell me something about number {n}"), assistant(f"Here is a fact about {n}.")]


def tool_exchange(n: int) -> list[Msg]:
    call = {"id": f"call-{n}", "name": "calculator", "args": {"expression": f"{n}*7"}}
    return [
        user(f"what is {n} times 7?"),
        assistant("", tool_calls=[call]),
        tool(str(n * 7), call_id=f"call-{n}"),
        assistant(f"{n} times 7 is {n * 7}."),
    ]


@dataclasses.dataclass
class Counter:
    statements: int = 0
    rows: int = 0


@contextmanager
def counting() -> Iterator[Counter]:
    """Count the statements chatq runs and the rows they return."""
    engine = get_engine()
    counter = Counter()

    def after(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        counter.statements += 1
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            counter.rows += max(cursor.rowcount, 0)

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield counter
    finally:
        event.remove(engine, "after_cursor_execute", after)


def assert_whole_turns(history: History) -> None:
    """Every tool message follows the assistant message that called it, and history starts with a user."""
    if history.messages:
        assert history.messages[0]["role"] == "user"
    open_calls: set[str] = set()
    for message in history.messages:
        assert set(message) == KEYS
        if message["role"] == "user":
            assert not open_calls, "a turn was cut between a tool call and its result"
        if message["tool_calls"]:
            open_calls |= {c["id"] for c in message["tool_calls"]}
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls
            open_calls.discard(message["tool_call_id"])


def test_an_empty_session_has_no_history() -> None:
    history = build_history(ref(create_session()))
    assert history == History(messages=[], omitted=0, summary=None, tokens=0)


def test_the_whole_history_fits_oldest_first() -> None:
    sid = create_session()
    turns = [exchange(0), tool_exchange(1), exchange(2)]
    for messages in turns:
        add_turn(sid, messages)
    expected = [m for messages in turns for m in messages]

    history = build_history(ref(sid), prompt="and now?")

    assert history.messages == as_dicts(expected)
    assert history.omitted == 0
    assert history.summary is None
    assert history.tokens == cost(expected)
    assert_whole_turns(history)


def test_truncation_keeps_the_newest_whole_turns_and_summarises_the_rest() -> None:
    sid = create_session()
    turns = [exchange(n) for n in range(10)]
    for messages in turns:
        add_turn(sid, messages)
    budget = sum(cost(t) for t in turns[-3:])

    history = build_history(ref(sid), budget_tokens=budget)

    assert history.messages == as_dicts([m for t in turns[-3:] for m in t])
    assert history.tokens == budget
    assert history.omitted == 14
    assert history.summary is not None
    assert history.summary.startswith("14 earlier messages from 7 turns omitted")
    assert '"topic 0: tell me something about number 0"' in history.summary
    assert '"topic 1: tell me something about number 1"' in history.summary
    assert "\n" not in history.summary

    one_short = build_history(ref(sid), budget_tokens=budget - 1)
    assert one_short.messages == as_dicts([m for t in turns[-2:] for m in t])
    assert one_short.omitted == 16


def test_the_summary_quotes_only_the_first_words_of_a_long_message() -> None:
    sid = create_session()
    add_turn(sid, [user("word " * 20_000), assistant("ok")])
    add_turn(sid, exchange(1))
    history = build_history(ref(sid), budget_tokens=cost(exchange(1)))
    assert history.omitted == 2
    assert history.summary is not None
    assert history.summary.count("word") == 12
    assert len(history.summary) < 300


@pytest.mark.parametrize("slack", [0, -1])
def test_a_tool_turn_is_kept_whole_or_dropped_whole(slack: int) -> None:
    sid = create_session()
    add_turn(sid, exchange(0))
    add_turn(sid, tool_exchange(1))
    budget = cost(tool_exchange(1)) + slack

    history = build_history(ref(sid), budget_tokens=budget)

    if slack == 0:
        assert history.messages == as_dicts(tool_exchange(1))
        assert history.omitted == 2
    else:
        # The older, smaller turn would fit, but history never skips a turn to take an older one.
        assert history.messages == []
        assert history.omitted == 6
        assert history.summary is not None
        assert history.summary.startswith("6 earlier messages from 2 turns omitted")


def test_every_budget_yields_whole_turns() -> None:
    sid = create_session()
    for n in range(6):
        add_turn(sid, tool_exchange(n) if n % 2 else exchange(n))
    full = build_history(ref(sid))
    for budget in range(0, full.tokens + 2, 7):
        history = build_history(ref(sid), budget_tokens=budget)
        assert history.tokens <= budget
        assert_whole_turns(history)
        assert history.messages == full.messages[len(full.messages) - len(history.messages) :]
        assert history.omitted == len(full.messages) - len(history.messages)
        assert (history.summary is None) == (history.omitted == 0)


def test_the_prompt_is_paid_for_out_of_the_budget() -> None:
    sid = create_session()
    for n in range(3):
        add_turn(sid, exchange(n))
    budget = cost(exchange(1)) + cost(exchange(2))
    assert len(build_history(ref(sid), budget_tokens=budget).messages) == 4
    prompt = "a question long enough to push one turn out"
    history = build_history(ref(sid), prompt=prompt, budget_tokens=budget)
    assert len(history.messages) == 2
    assert history.tokens <= budget - count_tokens(prompt)


def test_without_a_budget_a_plain_handler_gets_the_process_budget() -> None:
    # A plain handler calls trim_history(pages, prompt) with nothing handed in: CHATQ_HISTORY_TOKENS.
    sid = create_session()
    for n in range(3):
        add_turn(sid, exchange(n))
    with environ(CHATQ_HISTORY_TOKENS=str(cost(exchange(2)))):
        assert build_history(ref(sid)).messages == as_dicts(exchange(2))
    assert build_history(ref(sid)).messages == as_dicts(exchange(0) + exchange(1) + exchange(2))


@pytest.mark.parametrize("status", [TurnStatus.FAILED, TurnStatus.CANCELLED, TurnStatus.QUEUED, TurnStatus.RUNNING])
def test_only_succeeded_turns_are_history(status: TurnStatus) -> None:
    sid = create_session()
    add_turn(sid, exchange(0))
    add_turn(sid, [user("this turn did not succeed"), assistant("partial")], status=status)
    add_turn(sid, exchange(2))
    add_turn(sid, [user("the turn being answered now")], status=TurnStatus.RUNNING)
    add_turn(sid, [user("queued behind it")], status=TurnStatus.QUEUED)

    history = build_history(ref(sid))
    assert history.messages == as_dicts(exchange(0) + exchange(2))

    truncated = build_history(ref(sid), budget_tokens=cost(exchange(2)))
    assert truncated.messages == as_dicts(exchange(2))
    assert truncated.omitted == 2
    assert truncated.summary is not None
    assert truncated.summary.startswith("2 earlier messages from 1 turn omitted")
    assert "did not succeed" not in truncated.summary


def test_reply_to_takes_only_the_messages_before_it() -> None:
    sid = create_session()
    refs: list[TurnRef] = [add_turn(sid, exchange(n)) for n in range(4)]

    history = build_history(ref(sid), reply_to=refs[2].message_ids[0])
    assert history.messages == as_dicts(exchange(0) + exchange(1))
    assert history.omitted == 0

    first = build_history(ref(sid), reply_to=refs[0].message_ids[0])
    assert first == History(messages=[], omitted=0, summary=None, tokens=0)

    truncated = build_history(ref(sid), reply_to=refs[3].message_ids[0], budget_tokens=cost(exchange(2)))
    assert truncated.messages == as_dicts(exchange(2))
    assert truncated.omitted == 4
    assert truncated.summary is not None
    assert truncated.summary.startswith("4 earlier messages from 2 turns omitted")


def test_reply_to_a_failed_turns_message_regenerates_from_before_it() -> None:
    sid = create_session()
    add_turn(sid, exchange(0))
    failed = add_turn(sid, [user("try this again")], status=TurnStatus.FAILED)
    add_turn(sid, exchange(2))
    history = build_history(ref(sid), reply_to=failed.message_ids[0])
    assert history.messages == as_dicts(exchange(0))


def test_reply_to_must_be_a_user_message_of_this_session() -> None:
    sid = create_session()
    mine = add_turn(sid, exchange(0))
    other = add_turn(create_session(), exchange(0))

    cases = {
        other.message_ids[0]: "no such message in it",
        mine.message_ids[1]: "it is a assistant message",
        2**62: "no such message in it",
    }
    for reply_to, detail in cases.items():
        with pytest.raises(NotAUserMessage) as info:
            build_history(ref(sid), reply_to=reply_to)
        message = str(info.value)
        assert f"reply_to {reply_to} is not a user message of this session" in message
        assert detail in message
        assert "\n" not in message


def test_session_ids_may_be_strings_but_must_be_uuids() -> None:
    sid = create_session()
    add_turn(sid, exchange(0))
    assert len(build_history(SimpleNamespace(id=str(sid))).messages) == 2
    with pytest.raises(ValueError, match="is not a UUID"):
        build_history(SimpleNamespace(id="not-a-uuid"))


def test_a_zero_budget_keeps_nothing_and_says_so() -> None:
    sid = create_session()
    add_turn(sid, exchange(0))
    history = build_history(ref(sid), budget_tokens=0)
    assert history.messages == []
    assert history.omitted == 2
    assert history.summary is not None


@pytest.mark.slow  # big sessions
def test_a_10000_message_session_reads_only_what_fits() -> None:
    big = create_session()
    add_many_turns(big, 2_500)  # 10,000 messages
    small = create_session()
    add_many_turns(small, 25)  # 100 messages, still more than the budget holds
    budget = 500

    with counting() as small_cost:
        small_history = build_history(ref(small), budget_tokens=budget)
    with counting() as big_cost:
        big_history = build_history(ref(big), budget_tokens=budget)

    kept = len(big_history.messages)
    assert kept > 0
    assert kept % 4 == 0
    assert_whole_turns(big_history)
    assert big_history.omitted == 10_000 - kept
    assert big_history.summary is not None
    assert big_history.summary.startswith(f"{10_000 - kept} earlier messages from {2_500 - kept // 4} turns omitted")
    assert "question 000000 " in big_history.summary

    # The same statements and the same rows, whatever the length of the session ...
    assert big_cost.statements == small_cost.statements <= 5
    assert big_cost.rows == small_cost.rows
    # ... and only about what fits: at most one short page beyond the kept messages, plus the count.
    assert big_cost.rows <= kept + 16 + 1
    assert len(small_history.messages) == kept


@pytest.mark.slow  # big sessions
def test_long_messages_are_read_in_small_pages_not_a_page_sized_for_short_ones() -> None:
    sid = create_session()
    long_text = "lorem ipsum dolor sit amet " * 100  # about 500 tokens a message
    for n in range(60):
        add_turn(sid, [user(f"{n} {long_text}"), assistant(f"{n} {long_text}")])

    with counting() as cost:
        history = build_history(ref(sid), budget_tokens=6_000)

    kept = len(history.messages)
    assert 4 <= kept <= 12
    assert history.omitted == 120 - kept
    # A page sized for 32-token rows would be 187 rows of ~2 kB each; this reads the first page only.
    assert cost.rows <= kept + 16 + 1


def test_what_was_left_out_comes_from_the_running_totals_or_is_counted_without_them() -> None:
    sid = create_session()
    add_many_turns(sid, 300)
    add_turn(sid, exchange(1), status=TurnStatus.FAILED)  # not history: neither kept nor counted
    add_many_turns(sid, 30)
    with counting() as fast:
        with_totals = build_history(ref(sid), budget_tokens=500)
    assert with_totals.omitted == 330 * 4 - len(with_totals.messages)

    # Turns stored by a chatq older than the totals: the same answer, by counting.
    with session_scope() as db:
        db.execute(update(Turn).where(Turn.session_id == sid).values(history_turns=None, history_messages=None))
    with counting() as slow:
        without = build_history(ref(sid), budget_tokens=500)
    assert (without.omitted, without.summary, without.messages) == (
        with_totals.omitted,
        with_totals.summary,
        with_totals.messages,
    )
    assert slow.statements == fast.statements + 1
