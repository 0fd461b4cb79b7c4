"""What `chatq submit --follow` and `chatq watch` print for a person (worker.cli.follow.EventPrinter)."""

from __future__ import annotations

import io
from typing import Any

from worker.cli.follow import EventPrinter


def test_a_retry_note_keeps_the_errors_own_punctuation() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer({"type": "text", "text": "partial"})
    printer({"type": "retry", "attempt": 1, "error": "The model service returned an error (HTTP 500)."})
    assert out.getvalue() == "partial\n"
    assert err.getvalue() == "[attempt 1 failed, retrying: The model service returned an error (HTTP 500).]\n"
    assert ".;" not in err.getvalue()


def test_a_turn_waiting_for_the_model_service_is_not_called_a_failure() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer(
        {
            "type": "retry",
            "attempt": 0,
            "error": "the model service is rate limiting requests (HTTP 429); trying again in 1.2 s",
            "waiting": {"reason": "rate_limited", "until": 1_800_000_000.0},
        }
    )
    expected = "[waiting: the model service is rate limiting requests (HTTP 429); trying again in 1.2 s]\n"
    assert err.getvalue() == expected


def _report(status: str, reply: str | None = None, error: str | None = None) -> dict[str, Any]:
    """A stored turn as `worker.queries.turn_report` gives it (the fields the printer reads)."""
    messages = [{"role": "user", "content": "hi"}]
    if reply is not None:
        messages.append({"role": "assistant", "content": reply})
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    return {"status": status, "error": error, "usage": usage, "messages": messages}


def test_a_stored_reply_that_already_streamed_is_not_printed_again() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer({"type": "started", "attempt": 1})
    printer({"type": "text", "text": "Hello "})
    printer({"type": "text", "text": "there"})
    printer.stored(_report("succeeded", "Hello there"))
    assert out.getvalue() == "Hello there\n"
    assert err.getvalue() == "[done: 4 prompt + 2 completion tokens]\n"


def test_a_stored_reply_adds_what_did_not_stream_or_all_of_it() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer({"type": "text", "text": "Hello"})
    printer.stored(_report("succeeded", "Hello there"))
    assert out.getvalue() == "Hello there\n"
    # An attempt's text is dropped by its retry: the reply of the next one is printed whole.
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer({"type": "text", "text": "partial"})
    printer({"type": "retry", "attempt": 1, "error": "boom"})
    printer.stored(_report("succeeded", "whole"))
    assert out.getvalue() == "partial\nwhole\n"


def test_a_streamed_reply_is_not_printed_again_after_a_note() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer({"type": "text", "text": "Done."})
    printer({"type": "tool", "tool": {"name": "calculator", "status": "finished"}})
    printer({"type": "final", "messages": [{"role": "assistant", "content": "Done."}], "usage": {}})
    assert out.getvalue() == "Done.\n"


def test_a_stored_failure_or_cancel_is_a_note() -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, err)
    printer.stored(_report("failed", error="the model said no"))
    printer.stored(_report("cancelled"))
    assert out.getvalue() == ""
    assert err.getvalue() == "[failed: the model said no]\n[cancelled]\n"
