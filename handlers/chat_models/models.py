"""Chat model clients, built lazily and cached per process.

One client per (model, base URL, API key, timeout): building ChatOpenAI creates an HTTP client and
connection pool, which every turn of the process should share instead of rebuilding.
"""

from __future__ import annotations

import functools

from langchain_core.language_models import BaseChatModel

from chatq.errors import ConfigError
from chatq.settings import ECHO_MODEL
from handlers.chat_models.echo import EchoChatModel
from handlers.handler_settings import ModelEndpoint
from handlers.images import VISION_MODELS_ENV, model_accepts_images

__all__ = ["NO_KEY_PLACEHOLDER", "VISION_MODELS_ENV", "get_chat_model", "model_accepts_images"]

NO_KEY_PLACEHOLDER = "chatq-no-key"
"""Sent as the API key to an OpenAI-compatible server that needs none (vLLM, Ollama, a stub)."""


def get_chat_model(model_name: str, endpoint: ModelEndpoint) -> BaseChatModel:
    """The process's client for `model_name` on `endpoint` (the turn's, `TurnInput.endpoint`): `echo`
    is the offline model, anything else ChatOpenAI.

    Raises ConfigError when the model needs an OpenAI key or base URL the endpoint does not have.
    """
    name = model_name.strip()
    if name == ECHO_MODEL:
        return _echo()
    problem = endpoint.unavailable(name)
    if problem:
        # Configuration, not a passing failure: the turn fails at once instead of being retried.
        raise ConfigError(problem)
    return _openai(name, endpoint.base_url, endpoint.api_key, endpoint.timeout)


@functools.cache
def _echo() -> BaseChatModel:
    return EchoChatModel()


@functools.lru_cache(maxsize=32)
def _openai(model: str, base_url: str | None, api_key: str | None, timeout: float) -> BaseChatModel:
    # Imported here: langchain_openai pulls in openai and httpx, which the echo path never needs.
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    from chatq.shortcuts.openai_client import build_client
    from handlers.chat_models.http import model_http_client

    key = api_key or NO_KEY_PLACEHOLDER
    # chatq retries a failed invocation itself (one retry, with events); a hidden SDK retry
    # would double the wait and break the turn timeout.
    max_retries = 0
    # Our SDK client keeps streamed chunks as dicts and posts plain-JSON bodies as they are
    # (chatq/shortcuts/openai_client.py).
    # Its requests stop at once when the turn is cancelled (handlers/abortable_http.py).
    http_client = model_http_client(timeout)
    root = build_client(
        base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries, http_client=http_client
    )
    return ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key=SecretStr(key),
        # Usage arrives in the last streamed chunk; chatq stores and bills it.
        stream_usage=True,
        max_retries=max_retries,
        timeout=timeout,
        root_client=root,
        client=root.chat.completions,
    )
