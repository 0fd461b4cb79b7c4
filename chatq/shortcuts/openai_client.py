"""The openai SDK client chatq hands to ChatOpenAI: requests and streamed chunks skip typed rebuilds.

Written against openai 3.x (tested on 3.57.0) with langchain-openai 1.x. Two shortcuts, each where
the SDK rebuilds JSON that is already JSON (their CPU is in BENCHMARKS.md, "Shortcuts through
other libraries"):

- **Streamed chunks stay dicts.** For every streamed chunk the SDK builds a `ChatCompletionChunk`
  (nested pydantic models, through its unvalidated `construct`, which checks a runtime protocol per
  model), and langchain-openai's first step with it is `chunk.model_dump()`, back to a dict.
  langchain-openai reads dict chunks directly too, so skipping that round trip changes nothing it
  sees.
- **A plain-JSON request body is sent as it is.** `chat.completions.create` walks the whole body
  against its TypedDict annotations (`maybe_transform`) to rename aliased keys, format dates and
  dump pydantic models. Chat completion parameters have no aliases or formats, so for a body of
  dicts, lists, strings, numbers, booleans and None (what langchain-openai sends) the walk returns
  an equal body. Anything else (a pydantic model, a tuple, an unknown keyword, a missing `model`)
  takes the SDK's own path.

Bypasses: the SDK's private `OpenAI._process_response_data`, `Completions._post` (its client's
`post`) and `openai._base_client.make_request_options`. Fallback: on another openai major version, or when one
of those is missing, `build_client` returns a stock `openai.OpenAI`, logged once at INFO.
"""

from __future__ import annotations

import functools
import inspect
from importlib import metadata
from typing import Any

import openai
from openai.resources.chat import Chat
from openai.resources.chat.completions import Completions
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from chatq.shortcuts import Gate, minor_version

_VERSION = metadata.version("openai")

try:
    from openai._base_client import make_request_options
except ImportError:  # the gate below then keeps the shortcut off
    _PRIVATE_IMPORTED = False
else:
    _PRIVATE_IMPORTED = True

__all__ = ["ENABLED", "GATE", "DictChunkOpenAI", "PlainJSONCompletions", "build_client", "is_plain_json"]

WRITTEN_FOR = 3
"""The openai major version this shortcut was written against."""

ENABLED = True
"""False makes `build_client` return a stock `openai.OpenAI` (benchmarks and tests compare the two)."""

# `create` keywords that shape the HTTP request rather than its JSON body.
_REQUEST_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
_SCALARS = (str, int, float, bool, type(None))


def _problem() -> str | None:
    if minor_version(_VERSION)[0] != WRITTEN_FOR:
        return f"openai {_VERSION} is not {WRITTEN_FOR}.x"
    missing = [
        name
        for name, present in (
            ("openai._base_client.make_request_options", _PRIVATE_IMPORTED),
            ("OpenAI._process_response_data", hasattr(openai.OpenAI, "_process_response_data")),
            ("OpenAI.post", hasattr(openai.OpenAI, "post")),
        )
        if not present
    ]
    return f"the openai SDK has no {', '.join(missing)}" if missing else None


GATE = Gate("openai_client", _problem)


def is_plain_json(value: object) -> bool:
    """Whether `value` is made only of str-keyed dicts, lists, strings, numbers, booleans and None."""
    if isinstance(value, _SCALARS):
        return True
    if type(value) is dict:
        return all(type(key) is str and is_plain_json(item) for key, item in value.items())
    if type(value) is list:
        return all(is_plain_json(item) for item in value)
    return False


@functools.cache
def _create_keywords() -> frozenset[str]:
    """The keywords `Completions.create` accepts (its signature; `required_args` keeps it)."""
    return frozenset(inspect.signature(Completions.create).parameters) - {"self"}


class PlainJSONCompletions(Completions):
    """`chat.completions` whose `create` posts a plain-JSON body without the SDK's typed walk."""

    def create(self, **params: Any) -> Any:
        body = {key: value for key, value in params.items() if key not in _REQUEST_OPTIONS}
        post = getattr(self, "_post", None)  # set per resource by the SDK (its client's `post`)
        plain = "model" in body and "messages" in body and body.keys() <= _create_keywords() and is_plain_json(body)
        if post is None or not plain:
            return super().create(**params)
        stream = bool(body.get("stream"))
        return post(
            "/chat/completions",
            body=body,
            options=make_request_options(
                extra_headers=params.get("extra_headers"),
                extra_query=params.get("extra_query"),
                extra_body=params.get("extra_body"),
                timeout=params.get("timeout", openai.NOT_GIVEN),
                security={"bearer_auth": True},
            ),
            cast_to=ChatCompletion,
            stream=stream,
            stream_cls=openai.Stream[ChatCompletionChunk],
        )


class _Chat(Chat):
    """`client.chat` whose `completions` is `PlainJSONCompletions`."""

    @functools.cached_property
    def completions(self) -> PlainJSONCompletions:
        return PlainJSONCompletions(self._client)


class DictChunkOpenAI(openai.OpenAI):
    """`openai.OpenAI` with both shortcuts: dict chunks, and plain-JSON chat bodies sent as they are."""

    @functools.cached_property
    def chat(self) -> Chat:
        return _Chat(self)

    def _process_response_data(self, *, data: object, cast_to: Any, **kwargs: Any) -> Any:
        if cast_to is ChatCompletionChunk and isinstance(data, dict):
            return data
        return super()._process_response_data(data=data, cast_to=cast_to, **kwargs)


def build_client(
    *, base_url: str | None, api_key: str, timeout: float, max_retries: int, http_client: Any = None
) -> openai.OpenAI:
    """A client with ChatOpenAI's settings for these arguments (on `http_client` if given, else the
    SDK's own): `DictChunkOpenAI` where the shortcut is taken, else a stock `openai.OpenAI`."""
    cls = DictChunkOpenAI if ENABLED and GATE.usable() else openai.OpenAI
    return cls(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, http_client=http_client)
