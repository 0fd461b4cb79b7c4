"""`python -m bench.public_api ARGS`: `chatq ARGS` with some of chatq's shortcuts switched off.

`CHATQ_BENCH_PUBLIC_API` names them (comma-separated: kombu_channel, redis_resp, openai_client);
each one's `ENABLED` is set to False, so that library's public API is used instead
(chatq/shortcuts/). `bench.common.chatq_worker` starts workers through this module when the
variable is set, and `python -m bench` applies it in its own process too, so a benchmark can be
run side by side with and without a shortcut.
"""

from __future__ import annotations

import importlib
import os
import sys


def names() -> list[str]:
    """The shortcuts CHATQ_BENCH_PUBLIC_API switches off."""
    return [name.strip() for name in os.environ.get("CHATQ_BENCH_PUBLIC_API", "").split(",") if name.strip()]


def apply() -> None:
    """Switch the named shortcuts off in this process."""
    for name in names():
        importlib.import_module(f"chatq.shortcuts.{name}").ENABLED = False


if __name__ == "__main__":
    apply()
    from worker.cli import main

    sys.exit(main())
