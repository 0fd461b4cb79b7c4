"""What `chatq submit --follow` and `chatq watch` print for a person (worker.cli.follow.EventPrinter)."""

from __future__ import annotations

import io

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
