"""SSE framing and the session stream's resume cursor (no Redis needed)."""

from __future__ import annotations

import json

import pytest

from worker.gateway.session_stream import SessionCursor
from worker.gateway.sse import (
    encode_comment,
    encode_frame,
    encode_retry,
    parse_last_event_id,
    terminal_from_report,
)


def test_a_frame_has_its_id_then_one_data_line_per_line() -> None:
    assert encode_frame('{"a":1}', event_id="7") == b'id: 7\ndata: {"a":1}\n\n'
    assert encode_frame("one\ntwo\r\nthree\rfour") == b"data: one\ndata: two\ndata: three\ndata: four\n\n"
    # Only CR and LF end SSE lines: other Unicode line separators stay inside the data.
    assert encode_frame("a\u2028b") == "data: a\u2028b\n\n".encode()


def test_comments_and_retry() -> None:
    assert encode_comment("keepalive") == b": keepalive\n\n"
    assert encode_comment("a\nb") == b": a b\n\n"
    assert encode_retry(1000) == b"retry: 1000\n\n"


@pytest.mark.parametrize("value", ["0", "7", " 12 "])
def test_a_turn_stream_last_event_id_is_a_seq(value: str) -> None:
    assert parse_last_event_id(value) == int(value)


@pytest.mark.parametrize("value", ["", "-1", "seven", "1.5", "3:4", "9" * 40])
def test_a_bad_turn_stream_last_event_id_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="Last-Event-ID"):
        parse_last_event_id(value)


def test_the_session_cursor_round_trips_and_moves_past_finished_turns() -> None:
    cursor = SessionCursor(watermark=3)
    assert str(cursor) == "3:0"
    cursor.advance(3, 1, terminal=False)  # turn 3 queued
    cursor.advance(3, 2, terminal=False)  # turn 3 started
    cursor.advance(4, 1, terminal=False)  # turn 4 queued while 3 streams
    assert str(cursor) == "3:2,4:1"
    cursor.advance(3, 3, terminal=True)  # turn 3 final
    assert str(cursor) == "4:1"
    assert SessionCursor.parse(str(cursor)) == cursor


def test_the_session_cursor_says_what_was_delivered() -> None:
    cursor = SessionCursor.parse("3:2,5:1")
    assert cursor.watermark == 3
    assert not cursor.wants(2, 9)  # before the watermark: complete
    assert not cursor.wants(3, 2) and cursor.wants(3, 3)
    assert cursor.wants(4, 1)  # not listed: nothing of it delivered
    assert not cursor.wants(5, 1) and cursor.wants(5, 2)


def test_a_turn_finished_out_of_order_is_kept_until_the_watermark_reaches_it() -> None:
    cursor = SessionCursor.parse("3:2")
    cursor.advance(4, 1, terminal=False)
    cursor.advance(4, 2, terminal=True)  # turn 4 cancelled while queued, 3 still running
    assert str(cursor) == "3:2,4:2"
    assert not cursor.wants(4, 3)
    cursor.advance(3, 3, terminal=True)
    assert str(cursor) == "5:0"


def test_a_resumed_cursor_learns_that_a_listed_turn_is_done() -> None:
    cursor = SessionCursor.parse("3:2,4:2")
    cursor.finish(4)  # found its terminal (seq 2) in the replay stream
    cursor.advance(3, 3, terminal=True)
    assert str(cursor) == "5:0"


@pytest.mark.parametrize("value", ["", "3", "a:1", "3:-1", "3:1,", "3:1;4:2", "1:1," * 2000])
def test_a_bad_session_cursor_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="Last-Event-ID"):
        SessionCursor.parse(value)


def test_the_terminal_event_rebuilt_from_postgres() -> None:
    report = {
        "id": "t",
        "session_id": "s",
        "status": "succeeded",
        "attempts": 1,
        "error": None,
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    event = terminal_from_report(report)
    assert event["type"] == "final" and event["seq"] is None and event["source"] == "postgres"
    assert event["messages"] == [{"role": "assistant", "content": "hello"}]
    assert event["usage"]["total_tokens"] == 3
    json.dumps(event)
    failed = terminal_from_report({**report, "status": "failed", "error": "model down", "messages": []})
    assert failed["type"] == "error" and failed["error"] == "model down"
    assert terminal_from_report({**report, "status": "cancelled"})["type"] == "cancelled"
