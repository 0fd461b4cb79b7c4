"""Plain handlers (written to `handlers.base.BaseAgentHandler` alone) in a real worker: the plugin
module is named in the worker's CHATQ_PLUGINS, as a team porting its handlers would deploy them.

One case for the wiring (the worker imports the plugin, runs both kinds, retries a failure once,
keeps serving other turns while a plain handler blocks); the branches are covered in-process by
tests/integration/runtime/test_ported_handlers.py. A package of its own, so no worker without the
plugin competes for these turns.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.handlers import PORTED_FRAMEWORKS, PORTED_PLUGIN, plugin_installed
from tests.support.turns import replay_events, turn_messages, wait_for_turns
from tests.support.workers import WorkerProcess
from worker.producer import create_session, submit_turn

pytestmark = pytest.mark.slow

INVOKE, STREAM = PORTED_FRAMEWORKS


@pytest.fixture
def ported_worker(chatq_env: dict[str, str]) -> Iterator[WorkerProcess]:
    with plugin_installed(PORTED_PLUGIN, *PORTED_FRAMEWORKS):  # this process creates the sessions
        process = WorkerProcess({**chatq_env, "CHATQ_PLUGINS": PORTED_PLUGIN}, concurrency=4).start()
        try:
            yield process
        finally:
            process.stop()


def test_a_worker_runs_plain_handlers_from_chatq_plugins(ported_worker: WorkerProcess, redis_url: str) -> None:
    slow = submit_turn(create_session(framework=INVOKE), "slow [sleep: 8]")
    streamed = submit_turn(create_session(framework=STREAM), "hello worker")
    invoked = submit_turn(create_session(framework=INVOKE), "hello worker")
    failing = submit_turn(create_session(framework=STREAM), "hello [fail]")
    ids = [slow.turn_id, streamed.turn_id, invoked.turn_id, failing.turn_id]
    rows = wait_for_turns(ids, timeout=90)
    log = ported_worker.log()[-3000:]

    for turn, framework in ((streamed, STREAM), (invoked, INVOKE)):
        row = rows[turn.turn_id]
        assert (row.status.value, row.attempts) == ("succeeded", 1), log
        reply = f"hello worker | {framework} | history 0 | images 0 | reply_to None"
        assert turn_messages(turn.turn_id)[-1].content == reply
        events = replay_events(redis_url, turn.turn_id)
        final = events[-1]
        assert final["type"] == "final" and final["messages"][-1]["content"] == reply
        assert (row.prompt_tokens, row.completion_tokens, row.total_tokens) == (
            final["usage"]["prompt_tokens"],
            final["usage"]["completion_tokens"],
            final["usage"]["total_tokens"],
        )
        assert row.total_tokens > 0
        text = "".join(e["text"] for e in events if e["type"] == "text")
        assert text == (reply if framework == STREAM else "")  # invoke only: the final event alone

    assert [m.role for m in turn_messages(streamed.turn_id)] == ["user", "assistant", "tool", "assistant"]

    row = rows[failing.turn_id]
    assert (row.status.value, row.attempts, row.error) == ("failed", 2, "The ported agent failed."), log
    types = [e["type"] for e in replay_events(redis_url, failing.turn_id)]
    assert types.count("retry") == 1 and types[-1] == "error"
    assert [m.role for m in turn_messages(failing.turn_id)] == ["user"]

    # The blocked plain handler held none of the others up.
    assert rows[slow.turn_id].status.value == "succeeded", log
    finished = {turn_id: row.finished_at for turn_id, row in rows.items()}
    assert all(finished[turn_id] < finished[slow.turn_id] for turn_id in ids[1:])  # type: ignore[operator]
