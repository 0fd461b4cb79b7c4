"""Keeps the worker's start-up objects out of the garbage collector's full passes.

A worker imports LangGraph, LangChain, the OpenAI SDK, SQLAlchemy and Celery before its first
turn: about 230,000 container objects that live as long as the process. CPython's full
(generation 2) collection walks every one of them, and a busy worker runs one every few hundred
turns, each holding the interpreter lock long enough to stall every turn in the process (figures
in BENCHMARKS.md, bench io_concurrency). `gc.freeze()` moves them to the permanent generation, so full
passes only walk what the turns themselves keep (the technique of Instagram's "Dismissing Python
Garbage Collection", and of preforking servers that freeze before they fork). Collection itself
stays on, with the default thresholds: turns still free their reference cycles.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect once, then freeze every object that survived; returns how many are now frozen.

    Call it when start-up is over (imports and adapter preloading done). Anything frozen is never
    collected, so the collection first frees start-up garbage. Calling it again freezes what was
    kept since, which is only right at another start-up point (a forked pool child).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
