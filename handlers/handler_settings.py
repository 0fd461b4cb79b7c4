"""What handlers/ needs of the configuration, as values handed in, and the one place it reads them.

handlers/ gets its data handed in (issue 27): the worker derives a `HandlerSettings` from its
runtime's settings and hands it to `build_turn_input`; the turn's input carries on what the
adapters need (the model, the deadline, the model endpoint) and its `ToolContext` what the tool
machinery needs (`ToolSettings`: the output limit, the prices); pure functions take plain values
(`trim_history(budget_tokens=...)`, `model_accepts_images(name, vision_models)`).

Some public paths have no worker to hand anything in: a handler's `invoke`/`stream`/`astream`
called directly (`PreparedTurnHandler.prepare`), the plugin loading behind the framework registry,
and the helpers a plain handler calls with nothing to pass (`trim_history` without a budget,
`run_tool` outside a turn, `record_tool_call` outside one). Those are edges: they call
`process_handler_settings()` once, at their entry, and hand the values down. It is the only
function of handlers/ that reads the process's settings (tests/unit/test_layers.py holds both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chatq.settings import Settings, get_settings, openai_model_unavailable

__all__ = ["HandlerSettings", "ModelEndpoint", "ToolSettings", "process_handler_settings"]


@dataclass(frozen=True, kw_only=True)
class ModelEndpoint:
    """The OpenAI-compatible server a model client is built for (the adapters' clients are cached per value)."""

    base_url: str | None = None
    """`OPENAI_BASE_URL`; None: the openai SDK's default."""
    api_key: str | None = field(default=None, repr=False)
    """`OPENAI_API_KEY`, never logged; None: a placeholder is sent (servers that need no key)."""
    timeout: float = Settings.turn_timeout
    """Seconds a request may take at most (`CHATQ_TURN_TIMEOUT`; each request gets what is left of the turn's)."""

    def unavailable(self, model: str) -> str | None:
        """Why `model` cannot run on this endpoint (no key and no base URL), or None when it can."""
        return openai_model_unavailable(model, api_key=self.api_key, base_url=self.base_url)


@dataclass(frozen=True, kw_only=True)
class ToolSettings:
    """What running a tool needs of the configuration; it travels on the `ToolContext`."""

    max_output_chars: int = Settings.max_tool_output_chars
    """Tool results are cut to this many characters before they reach the model (`CHATQ_MAX_TOOL_OUTPUT_CHARS`)."""
    prices: str | None = None
    """`CHATQ_PRICES` as configured (JSON text or a file's path; `handlers.accounting.load_prices`); None: unset."""


@dataclass(frozen=True, kw_only=True)
class HandlerSettings:
    """The part of chatq's settings handlers/ uses, derived from them once (`of`) and handed in."""

    default_model: str = Settings.default_model
    """The model of a session that names none (`CHATQ_MODEL`)."""
    endpoint: ModelEndpoint = field(default_factory=ModelEndpoint)
    """The model server, its key and the request timeout (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `CHATQ_TURN_TIMEOUT`)."""
    turn_timeout: float = Settings.turn_timeout
    """Seconds one invocation may take (`CHATQ_TURN_TIMEOUT`): the turn's deadline."""
    history_tokens: int = Settings.history_tokens
    """Token budget of the history sent with a turn (`CHATQ_HISTORY_TOKENS`)."""
    vision_models: tuple[str, ...] = ()
    """Extra model names that take images (`CHATQ_VISION_MODELS`)."""
    tools: ToolSettings = field(default_factory=ToolSettings)
    """What the tools' machinery needs (output limit, prices)."""
    plugins: tuple[str, ...] = ()
    """Modules that register tools or frameworks (`CHATQ_PLUGINS`), imported by `handlers.load_plugins`."""

    @classmethod
    def of(cls, settings: Settings) -> HandlerSettings:
        """The values handlers/ needs of `settings` (a worker's runtime's, the CLI's, the process's)."""
        return cls(
            default_model=settings.default_model,
            endpoint=ModelEndpoint(
                base_url=settings.openai_base_url, api_key=settings.openai_api_key, timeout=settings.turn_timeout
            ),
            turn_timeout=settings.turn_timeout,
            history_tokens=settings.history_tokens,
            vision_models=settings.vision_models,
            tools=ToolSettings(max_output_chars=settings.max_tool_output_chars, prices=settings.prices),
            plugins=settings.plugins,
        )

    def session_model(self, model: str | None) -> str:
        """The model a session runs on: its own, or `default_model` when it names none (NULL)."""
        return (model or "").strip() or self.default_model


def process_handler_settings() -> HandlerSettings:
    """This process's settings as handlers/ uses them: for the public entries that have no worker
    to hand them in (see the module docstring), each of which calls it once and passes the values on."""
    return HandlerSettings.of(get_settings())
