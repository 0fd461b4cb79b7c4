"""Environment variables for a block of a test, with chatq's settings re-read on the way in and out."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables and re-read settings; restore both afterwards."""
    from chatq.settings import reset_settings

    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    reset_settings()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_settings()
