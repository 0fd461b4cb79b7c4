"""worker.ops.gc_freeze: start-up objects leave the garbage collector's passes; later garbage is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from worker.ops.gc_freeze import freeze_startup_objects


class _Node:
    """A container that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # later tests see the interpreter as it was


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_survivors_are_frozen_and_skipped_by_collections(unfrozen: None) -> None:
    kept = _Node()
    frozen = freeze_startup_objects()
    # Frozen objects still die by reference count, so the count can only fall after the freeze.
    assert 0 < gc.get_freeze_count() <= frozen
    tracked = {id(o) for o in gc.get_objects()}
    assert id(kept) not in tracked  # a full pass no longer walks it


def test_startup_garbage_is_freed_before_the_freeze(unfrozen: None) -> None:
    garbage = _cycle()  # unreachable, but only the cycle collector can free it
    freeze_startup_objects()
    assert garbage() is None  # not frozen forever


def test_cycles_made_after_the_freeze_are_still_collected(unfrozen: None) -> None:
    freeze_startup_objects()
    later = _cycle()
    gc.collect()
    assert later() is None
