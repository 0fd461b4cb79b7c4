"""`CHATQ_MODEL_LIMITS`: the request, token and concurrency limits of each model, as configured.

JSON text, or the path of a file holding it: an object whose keys name a model (`"gpt-4o-mini"`),
a model at one base URL (`"gpt-4o-mini@https://api.openai.com/v1"`, which wins over the plain
name there), or every other model (`"*"`), and whose values give any of

    {"rpm": 500, "tpm": 200000, "max_concurrent": 16}

(requests per minute, tokens per minute, requests in flight). A limit left out is not enforced;
the adaptive limit (`worker.runtime.policy.limits`) still applies. Parsed once at start-up, so a bad value
stops the worker with one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from chatq.errors import ConfigError

__all__ = ["ANY_MODEL", "ModelLimit", "limit_for", "parse_model_limits"]

ANY_MODEL = "*"
"""The key whose limits apply to every model without its own entry."""

_FIELDS = ("rpm", "tpm", "max_concurrent")


@dataclass(frozen=True, kw_only=True)
class ModelLimit:
    """One entry of `CHATQ_MODEL_LIMITS`."""

    key: str
    """The entry's key: a model name, `MODEL@BASE_URL`, or `*`."""
    rpm: float | None = None
    """Requests per minute the whole fleet may send (None: not configured)."""
    tpm: float | None = None
    """Tokens per minute (prompt + completion) the whole fleet may use (None: not configured)."""
    max_concurrent: int | None = None
    """Requests in flight at once across the fleet (None: not configured)."""


def parse_model_limits(raw: str | None) -> tuple[ModelLimit, ...]:
    """The entries of `raw` (JSON text or a file path); ConfigError names what is wrong."""
    text = (raw or "").strip()
    if not text:
        return ()
    if not text.startswith(("{", "[")):
        try:
            text = Path(text).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"CHATQ_MODEL_LIMITS: cannot read {raw!r}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"CHATQ_MODEL_LIMITS is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError("CHATQ_MODEL_LIMITS must be a JSON object of model name -> limits")
    return tuple(_entry(str(key), value) for key, value in data.items())


def _entry(key: str, value: object) -> ModelLimit:
    if not key.strip():
        raise ConfigError("CHATQ_MODEL_LIMITS: a model name is empty")
    if not isinstance(value, Mapping):
        raise ConfigError(f'CHATQ_MODEL_LIMITS[{key!r}] must be an object such as {{"rpm": 500}}')
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"CHATQ_MODEL_LIMITS[{key!r}]: unknown field {unknown[0]!r} (use rpm, tpm, max_concurrent)")
    numbers: dict[str, float] = {}
    for name in _FIELDS:
        item = value.get(name)
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int | float) or not item > 0:
            raise ConfigError(f"CHATQ_MODEL_LIMITS[{key!r}].{name} must be a positive number, got {item!r}")
        numbers[name] = float(item)
    concurrent = numbers.get("max_concurrent")
    if concurrent is not None and concurrent != int(concurrent):
        raise ConfigError(f"CHATQ_MODEL_LIMITS[{key!r}].max_concurrent must be a whole number, got {concurrent!r}")
    return ModelLimit(
        key=key.strip(),
        rpm=numbers.get("rpm"),
        tpm=numbers.get("tpm"),
        max_concurrent=int(concurrent) if concurrent is not None else None,
    )


def limit_for(limits: tuple[ModelLimit, ...], model: str, base_url: str | None) -> ModelLimit | None:
    """The entry that applies to `model` at `base_url`: `MODEL@BASE_URL`, else `MODEL`, else `*`.

    Base URLs match with or without a trailing slash.
    """
    base = (base_url or "").rstrip("/")
    plain: ModelLimit | None = None
    anything: ModelLimit | None = None
    for entry in limits:
        name, _, url = entry.key.partition("@")
        if url and name == model and url.rstrip("/") == base:
            return entry
        if not url and name == model:
            plain = entry
        elif entry.key == ANY_MODEL:
            anything = entry
    return plain or anything
