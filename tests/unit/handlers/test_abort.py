"""The abort signal: callbacks run once, late registrations run at once, a block's registration ends with it."""

from __future__ import annotations

import threading

from handlers.abort import AbortSignal, abortable, current_abort


def test_abort_calls_the_callbacks_registered_at_that_moment_once() -> None:
    signal = AbortSignal()
    calls: list[str] = []
    with signal.on_abort(lambda: calls.append("a")), signal.on_abort(lambda: calls.append("b")):
        signal.abort("cancelled")
        signal.abort("again")
    assert calls == ["a", "b"]
    assert signal.aborted and signal.reason == "cancelled"


def test_a_callback_registered_after_the_abort_runs_at_once() -> None:
    signal = AbortSignal()
    signal.abort("shutting down")
    calls: list[int] = []
    with signal.on_abort(lambda: calls.append(1)):
        assert calls == [1]


def test_a_finished_block_is_not_called_and_a_raising_callback_does_not_stop_the_others() -> None:
    signal = AbortSignal()
    calls: list[str] = []
    with signal.on_abort(lambda: calls.append("finished")):
        pass

    def broken() -> None:
        raise OSError("socket already closed")

    with signal.on_abort(broken), signal.on_abort(lambda: calls.append("live")):
        signal.abort("cancelled")
    assert calls == ["live"]


def test_the_current_signal_is_the_blocks_and_other_threads_see_none() -> None:
    signal = AbortSignal()
    seen: list[AbortSignal | None] = []
    assert current_abort() is None
    with abortable(signal):
        assert current_abort() is signal
        thread = threading.Thread(target=lambda: seen.append(current_abort()))
        thread.start()
        thread.join()
    assert current_abort() is None
    assert seen == [None]
