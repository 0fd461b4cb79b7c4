from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from handlers.tokens import MESSAGE_OVERHEAD_TOKENS, count_message_tokens, count_tokens

ENGLISH = (
    "Celery workers pick up chat turns from Redis, run the agent and store the reply in Postgres. "
    "If a worker dies halfway through, the turn is delivered again and the reply is stored once. "
    "Consumers follow the conversation live over pub/sub, or replay a finished turn's events later."
)

CODE = '''
def fibonacci(n: int) -> list[int]:
    """The first n Fibonacci numbers."""
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


if __name__ == "__main__":
    print(fibonacci(10))
'''


def test_empty_text_has_no_tokens() -> None:
    assert count_tokens("") == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Reference counts of cl100k/o200k, which the estimate matches on these simple cases.
        ("Hello, world!", 4),
        ("The quick brown fox jumps over the lazy dog.", 10),
        ("1234567890", 4),
        ("你好世界", 4),
    ],
)
def test_simple_texts_match_bpe_counts(text: str, expected: int) -> None:
    assert count_tokens(text) == expected


def test_english_prose_is_about_four_characters_per_token() -> None:
    ratio = len(ENGLISH) / count_tokens(ENGLISH)
    assert 3.5 <= ratio <= 5.5


def test_code_is_denser_than_prose_but_within_bpe_range() -> None:
    ratio = len(CODE) / count_tokens(CODE)
    assert 2.5 <= ratio <= 4.5
    assert ratio < len(ENGLISH) / count_tokens(ENGLISH)


def test_long_words_split_into_several_tokens() -> None:
    assert count_tokens("cat") == 1
    assert count_tokens("internationalization") >= 2
    assert 10 <= count_tokens("a" * 100) <= 30


def test_cjk_counts_about_one_token_per_character() -> None:
    text = "机器学习是人工智能的一个分支"
    assert count_tokens(text) == len(text)


def test_whitespace_runs_are_cheap() -> None:
    assert count_tokens(" " * 8) == 1
    assert count_tokens("a" + " " * 64 + "b") <= 12


def test_counting_is_deterministic_and_scales_linearly() -> None:
    assert count_tokens(ENGLISH) == count_tokens(ENGLISH)
    assert count_tokens(ENGLISH * 100) == pytest.approx(100 * count_tokens(ENGLISH), rel=0.02)


@given(st.text(max_size=200), st.text(max_size=200))
def test_concatenation_never_costs_more_than_its_parts(a: str, b: str) -> None:
    # The property that keeps budget arithmetic safe: counting pieces separately never under-counts.
    assert count_tokens(a + b) <= count_tokens(a) + count_tokens(b)


@given(st.text(max_size=300))
def test_any_text_gets_a_sane_count(text: str) -> None:
    tokens = count_tokens(text)
    assert 0 <= tokens <= len(text)
    assert (tokens == 0) == (text == "")


def test_message_overhead_applies_to_an_empty_message() -> None:
    assert count_message_tokens({"role": "user", "content": ""}) == MESSAGE_OVERHEAD_TOKENS
    assert count_message_tokens({"role": "assistant", "content": None}) == MESSAGE_OVERHEAD_TOKENS


def test_message_counts_content_tool_calls_and_tool_call_id() -> None:
    content = "What is 6 times 7?"
    calls = [{"id": "call-1", "name": "calculator", "args": {"expression": "6*7"}}]
    text_only = count_message_tokens({"role": "user", "content": content})
    assert text_only == MESSAGE_OVERHEAD_TOKENS + count_tokens(content)
    with_calls = count_message_tokens({"role": "assistant", "content": "", "tool_calls": calls})
    assert with_calls == MESSAGE_OVERHEAD_TOKENS + count_tokens(json.dumps(calls, separators=(",", ":")))
    tool = count_message_tokens({"role": "tool", "content": "42", "tool_call_id": "call-1"})
    assert tool == MESSAGE_OVERHEAD_TOKENS + count_tokens("42") + count_tokens("call-1")


def test_multipart_content_is_counted_from_its_json() -> None:
    parts = [{"type": "text", "text": "describe this picture"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert count_message_tokens({"role": "user", "content": parts}) > count_message_tokens(
        {"role": "user", "content": "describe this picture"}
    )
