"""The HTTP client of the openai SDK clients both adapters build: requests the turn's abort signal stops.

openai 3.x is built on httpx2, which `handlers.abortable_http` speaks; on an SDK built on another
HTTP client (openai 2.x uses httpx) the SDK keeps its own client and a cancelled turn stops at its
model's next chunk, as before (logged once at INFO).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import openai

__all__ = ["model_http_client"]

log = logging.getLogger(__name__)


@functools.cache
def _abortable() -> bool:
    try:
        import httpx2
    except ImportError:
        usable = False
    else:
        usable = issubclass(openai.DefaultHttpxClient, httpx2.Client)
    if not usable:
        log.info("the openai SDK is not built on httpx2: a cancelled turn stops at its model's next chunk")
    return usable


def model_http_client(timeout: float) -> Any:
    """An SDK HTTP client whose requests a cancel, a lost lease or shutdown closes at once (None: the SDK's own)."""
    if not _abortable():
        return None
    from handlers.abortable_http import abortable_transport

    return openai.DefaultHttpxClient(transport=abortable_transport(), timeout=timeout)
