"""What turns cost: the record of paid tool calls and the user's price table.

`record_tool_call` records one paid tool call exactly once, through the recorder the store injected
on the tool context (`ToolContext.recorder`; chatq's stores it in `paid_tool_calls`,
`models.turn_store.record_paid_call`): the key is (invocation, tool call id). "Once per call"
means once per *execution* of a call:

- the same call recorded twice (a retried write, a framework that replays a step) is stored once;
- a retried turn runs the handler again, and the calls of that new attempt really happen again and
  cost money again, so they are new rows (a new invocation id, their own call ids, `attempt` 2).

`run_tool` records every paid tool it runs inside a handler invocation (it has a `ToolContext`),
before running it, so no paid call ever runs unrecorded; a framework that executes tools its own
way calls `record_tool_call` itself. Token costs are not stored: `chatq usage` estimates them
from the stored token counts and the current price table.

The price table comes from `CHATQ_PRICES`, JSON text or the path of a JSON file, handed in
(`ToolSettings.prices` on the tool context; `load_prices(raw)` parses it):

    {"models": {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}},   # per million tokens
     "tools": {"search_knowledge_base": 0.002},                          # per unit (one call)
     "currency": "USD"}

A plain `{"gpt-4o-mini": {"prompt": ..., "completion": ...}}` is read as the "models" part. A
model is looked up by its exact name, then without a provider prefix (`openai/gpt-4o-mini`).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

from chatq.errors import ConfigError
from chatq.settings import ECHO_MODEL
from handlers.context import current_tool_context
from handlers.handler_settings import process_handler_settings
from handlers.store import PaidCallRecorder, default_store

__all__ = [
    "PRICES_ENV",
    "ModelPrice",
    "PriceTable",
    "load_prices",
    "parse_prices",
    "record_tool_call",
]

PRICES_ENV = "CHATQ_PRICES"
TOKENS_PER_PRICE_UNIT = 1_000_000
"""Model prices are per million tokens, as providers quote them."""


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """What a model's tokens cost, per million."""

    prompt: Decimal
    completion: Decimal

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """The cost of these tokens."""
        return (self.prompt * prompt_tokens + self.completion * completion_tokens) / TOKENS_PER_PRICE_UNIT


@dataclass(frozen=True, kw_only=True)
class PriceTable:
    """Prices of models (per million tokens) and tools (per unit)."""

    models: Mapping[str, ModelPrice] = field(default_factory=dict)
    tools: Mapping[str, Decimal] = field(default_factory=dict)
    currency: str = "USD"

    def model_price(self, model: str) -> ModelPrice | None:
        """The price of `model`: its exact name, else its name without a provider prefix.

        The offline `echo` model costs nothing unless the table says otherwise.
        """
        name = model.strip()
        price = self.models.get(name) or self.models.get(name.rsplit("/", 1)[-1])
        if price is None and name == ECHO_MODEL:
            return ModelPrice(prompt=Decimal(0), completion=Decimal(0))
        return price

    def token_cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> Decimal | None:
        """Estimated cost of tokens of `model`; None when the table has no price for it."""
        price = self.model_price(model)
        return None if price is None else price.cost(prompt_tokens, completion_tokens)

    def tool_price(self, tool: str, default: Decimal | float = 0) -> Decimal:
        """The price of one unit of `tool`: the table's, else the tool's own default."""
        return self.tools.get(tool, _decimal(default, f"price of {tool}"))


def _decimal(value: object, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ConfigError(f"{PRICES_ENV}: {what} must be a number, got {value!r}")
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise ConfigError(f"{PRICES_ENV}: {what} must be a number, got {value!r}") from None
    if not number.is_finite() or number < 0:
        raise ConfigError(f"{PRICES_ENV}: {what} must be a number of at least 0, got {value!r}")
    return number


def _model_prices(data: object) -> dict[str, ModelPrice]:
    if not isinstance(data, Mapping):
        raise ConfigError(f'{PRICES_ENV}: "models" must map model names to {{"prompt", "completion"}} prices')
    prices: dict[str, ModelPrice] = {}
    for name, entry in data.items():
        if not isinstance(entry, Mapping) or not {"prompt", "completion"} <= set(entry):
            raise ConfigError(f'{PRICES_ENV}: model {name!r} needs "prompt" and "completion" prices per million tokens')
        prices[str(name)] = ModelPrice(
            prompt=_decimal(entry["prompt"], f"prompt price of {name}"),
            completion=_decimal(entry["completion"], f"completion price of {name}"),
        )
    return prices


def parse_prices(raw: str) -> PriceTable:
    """A price table from its JSON text (see the module docstring); ConfigError if it is invalid."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{PRICES_ENV} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{PRICES_ENV} must be a JSON object")
    if not ({"models", "tools", "currency"} & set(data)):
        return PriceTable(models=_model_prices(data))
    unknown = set(data) - {"models", "tools", "currency"}
    if unknown:
        raise ConfigError(f"{PRICES_ENV}: unknown keys {', '.join(sorted(unknown))} (use models, tools, currency)")
    tools = data.get("tools") or {}
    if not isinstance(tools, Mapping):
        raise ConfigError(f'{PRICES_ENV}: "tools" must map tool names to a price per unit')
    currency = data.get("currency") or "USD"
    if not isinstance(currency, str) or not currency.strip() or len(currency) > 16:
        raise ConfigError(f'{PRICES_ENV}: "currency" must be a short text such as "USD"')
    return PriceTable(
        models=_model_prices(data.get("models") or {}),
        tools={str(name): _decimal(price, f"price of tool {name}") for name, price in tools.items()},
        currency=currency.strip(),
    )


@functools.lru_cache(maxsize=8)
def _cached(raw: str, mtime_ns: int | None) -> PriceTable:
    if mtime_ns is None:
        return parse_prices(raw)
    try:
        return parse_prices(Path(raw).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{PRICES_ENV}: cannot read {raw}: {exc.strerror or exc}") from None


def load_prices(raw: str | None) -> PriceTable:
    """The price table of `raw`, `CHATQ_PRICES` as configured (JSON text or a file's path; empty when
    None or blank); a file is re-read when it changes."""
    raw = (raw or "").strip()
    if not raw:
        return PriceTable()
    if raw.startswith("{"):
        return _cached(raw, None)
    path = Path(raw).expanduser()
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        raise ConfigError(f"{PRICES_ENV} is neither a JSON object nor a readable file: {raw}") from None
    return _cached(raw, mtime)


def record_tool_call(
    *,
    tool_name: str,
    tool_call_id: str,
    invocation_id: uuid.UUID,
    session_id: uuid.UUID | None = None,
    turn_id: uuid.UUID | None = None,
    attempt: int | None = None,
    units: int = 1,
    unit_price: Decimal | float | None = None,
    default_price: Decimal | float = 0,
    recorder: PaidCallRecorder | None = None,
    prices: str | None = None,
) -> bool:
    """Record one paid tool call; True if stored now, False if this call was already recorded.

    `invocation_id` + `tool_call_id` identify the call (see the module docstring). Without
    `turn_id`, the store takes the session's running turn (and its attempt): a session runs one
    turn at a time, so that is the turn the call belongs to. `unit_price` defaults to the price
    table's price for the tool (`prices`, `CHATQ_PRICES` as configured: else the current tool
    context's, `ToolContext.settings`, else this process's), else `default_price`; the cost is
    `units * unit_price`.

    The call goes to `recorder`, else to the current tool context's (`ToolContext.recorder`, which
    the store injected), else to the default store's. Errors of the store pass through unchanged.
    """
    if units < 0:
        raise ValueError("units must be at least 0")
    context = current_tool_context()
    if unit_price is None:
        if prices is None:
            settings = context.settings if context is not None else None
            # Outside a turn nothing was handed in: this public entry reads the process's.
            prices = (settings or process_handler_settings().tools).prices
        price = load_prices(prices).tool_price(tool_name, default_price)
    else:
        price = Decimal(str(unit_price))
    if recorder is None:
        recorder = context.recorder if context is not None and context.recorder is not None else None
    if recorder is None:
        recorder = default_store().recorder()
    return recorder(
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        invocation_id=invocation_id,
        session_id=session_id,
        turn_id=turn_id,
        attempt=attempt,
        units=units,
        unit_price=price,
    )
