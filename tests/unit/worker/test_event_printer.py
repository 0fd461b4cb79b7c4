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
