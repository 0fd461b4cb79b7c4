"""chatq settings: every chatq environment variable (`CHATQ_*`, `OPENAI_*`, `DATABASE_URL`, `REDIS_URL`), parsed here.

`get_settings()` parses the environment once per process (a `chatq.per_process` value, which
`reset_settings()` forgets) and validates it, so a bad value stops a worker or a CLI call at start-up
with one clear line instead of failing a turn later. The gateway's four (`GatewayVariables`) are
parsed by `load_gateway_variables()` when `chatq serve` starts, so a bad one stops the gateway only
(`chatq.gateway_variables`). Each value is read by a parser of `chatq.env_values`; secrets are
masked in text by `chatq.masking` (`mask_secrets`).
What is parsed is the environment as `chatq.envfile.resolved_environ` leaves it: the process
environment, with what it leaves unset filled from `.env` and `.local/services.env` in the current
directory, so every entry point (the CLI, the Python API, `celery -A worker`, the gateway, Flower)
resolves the same values. Two kinds are read elsewhere: `CHATQ_ENV_FILES` by `chatq.envfile`, which
says which files fill the rest, and Flower's own `FLOWER_*` options, which `worker.ops.flower` checks
and hands to Flower. README's Configuration section lists every one;
`tests/unit/test_environment.py` holds that no other module reads a chatq variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from chatq.env_values import (
    env_address,
    env_choice,
    env_float,
    env_int,
    env_modules,
    env_names,
    env_optional_float,
    env_port,
    env_switch,
    env_url,
)
from chatq.envfile import resolved_environ
from chatq.errors import ConfigError
from chatq.masking import mask_url
from chatq.model_limits import ModelLimit, parse_model_limits
from chatq.per_process import PerProcess
from chatq.tenant_budgets import TenantBudget, parse_tenant_budgets
from chatq.tenant_weights import TenantWeights, parse_tenant_weights

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_OPENAI_MODEL",
    "DEFAULT_REDIS_URL",
    "ECHO_MODEL",
    "Settings",
    "get_settings",
    "load_settings",
    "openai_model_unavailable",
    "reset_settings",
]

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@localhost:5432/chatq"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
ECHO_MODEL = "echo"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


def openai_model_unavailable(model: str, *, api_key: str | None, base_url: str | None) -> str | None:
    """Why `model` cannot run with this OpenAI key and base URL, or None when it can.

    Every model but `echo` needs an OpenAI-compatible server: `OPENAI_API_KEY` or `OPENAI_BASE_URL`.
    """
    name = model.strip()
    if name == ECHO_MODEL or api_key or base_url:
        return None
    return f"Model {name!r} needs OPENAI_API_KEY or OPENAI_BASE_URL; use the 'echo' model to run offline."


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Typed, validated configuration read from the environment."""

    database_url: str = DEFAULT_DATABASE_URL
    """SQLAlchemy URL of Postgres (`DATABASE_URL`, psycopg 3 driver)."""
    redis_url: str = DEFAULT_REDIS_URL
    """Broker and pub/sub URL (`REDIS_URL`; `rediss://` and passwords work)."""
    default_model: str = ECHO_MODEL
    """Model of sessions that name none (`CHATQ_MODEL`; `echo` when no OpenAI key is set). Such a session
    stores no model (NULL), so the worker running its turn decides, by the worker's environment."""
    openai_api_key: str | None = field(default=None, repr=False)
    """`OPENAI_API_KEY`, handed to langchain-openai and never logged."""
    openai_base_url: str | None = None
    """`OPENAI_BASE_URL` of any OpenAI-compatible server."""
    turn_timeout: float = 120.0
    """Seconds one handler invocation may take (`CHATQ_TURN_TIMEOUT`)."""
    approval_timeout: float = 86_400.0
    """Seconds a turn waits for a person's decision on its tool calls before they are denied as
    "timed out" (`CHATQ_APPROVAL_TIMEOUT`; a session's `approval_timeout` metadata overrides it)."""
    max_content_chars: int = 100_000
    """Longest accepted user message (`CHATQ_MAX_CONTENT_CHARS`)."""
    max_images: int = 4
    """Most images one turn may carry (`CHATQ_MAX_IMAGES`)."""
    max_image_bytes: int = 5_000_000
    """Largest accepted image, decoded (`CHATQ_MAX_IMAGE_BYTES`)."""
    history_tokens: int = 6_000
    """Token budget for the history sent with a turn (`CHATQ_HISTORY_TOKENS`)."""
    max_attempts: int = 2
    """Handler invocations per turn when it raises AgentInvocationError (`CHATQ_MAX_ATTEMPTS`)."""
    retry_delay: float = 1.0
    """Seconds before the retry of a failed invocation (`CHATQ_RETRY_DELAY`)."""
    lease_seconds: float = 30.0
    """How long a running turn's lease lasts without renewal (`CHATQ_LEASE_SECONDS`)."""
    max_deliveries: int = 3
    """Claims of one turn before it is declared poison and failed (`CHATQ_MAX_DELIVERIES`)."""
    sweep_interval: float = 10.0
    """Seconds between sweeps, in every worker and under `chatq beat` (`CHATQ_SWEEP_INTERVAL`)."""
    due_interval: float = 1.0
    """Seconds between the rounds of every worker's due steps: delayed turns released (`CHATQ_DUE_INTERVAL`)."""
    worker_sweep: bool = True
    """Whether each `chatq worker` runs the sweep on its own timer (`CHATQ_WORKER_SWEEP`, `on`/`off`)."""
    thread_share: bool = True
    """Whether tenants share the workers' threads by weight when they are the bottleneck (`CHATQ_THREAD_SHARE`,
    `on`/`off`; `worker.runtime.policy.threads`). Off: tenants' batch turns run in the order they were sent."""
    requeue_grace: float = 30.0
    """Seconds a runnable queued turn may wait before the sweeper re-sends it (`CHATQ_REQUEUE_GRACE`)."""
    schedule_misfire_grace: float = 10.0
    """Seconds a schedule's tick may be late and still run as usual; later ones follow its misfire
    policy (`CHATQ_SCHEDULE_MISFIRE_GRACE`, docs/contract.md "Schedules")."""
    event_retention: int = 3_600
    """Seconds a turn's replay stream is kept after its last event (`CHATQ_EVENT_RETENTION`)."""
    text_coalesce_ms: float = 0.0
    """Window in which streamed text chunks are merged into one event (`CHATQ_TEXT_COALESCE_MS`)."""
    worker_concurrency: int = 128
    """Turns each `chatq worker` process runs at once on its thread pool (`CHATQ_WORKER_CONCURRENCY`)."""
    max_tool_output_chars: int = 20_000
    """Tool results longer than this are cut before they reach the model (`CHATQ_MAX_TOOL_OUTPUT_CHARS`)."""
    plugins: tuple[str, ...] = ()
    """Modules a worker imports at start to register tools or frameworks (`CHATQ_PLUGINS`, comma-separated)."""
    metrics_port: int | None = None
    """Port of each worker's Prometheus endpoint (`CHATQ_METRICS_PORT`; off when unset)."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics endpoint listens on (`CHATQ_METRICS_ADDR`): this machine only unless set."""
    log_format: str = "auto"
    """`json`, `text`, or `auto`: JSON when stderr is not a terminal (`CHATQ_LOG_FORMAT`)."""
    vision_models: tuple[str, ...] = ()
    """Extra model names that take images, for self-hosted vision models (`CHATQ_VISION_MODELS`, comma-separated)."""
    prices: str | None = None
    """Prices of models and paid tools: a JSON object, or the path of a file holding one, re-read when it
    changes (`CHATQ_PRICES`; parsed by `handlers.accounting`)."""
    model_limits: tuple[ModelLimit, ...] = ()
    """Configured request, token and concurrency limits per model (`CHATQ_MODEL_LIMITS`, `chatq.model_limits`)."""
    tenant_weights: TenantWeights = field(default_factory=TenantWeights)
    """How a limited model's capacity is split between the tenants waiting for it (`CHATQ_TENANT_WEIGHTS`,
    `chatq.tenant_weights`)."""
    tenant_budgets: tuple[TenantBudget, ...] = ()
    """How much each tenant may spend per UTC day or month, in USD or tokens (`CHATQ_TENANT_BUDGETS`,
    `chatq.tenant_budgets`; enforced by `worker.budgets`). Empty: no budgets."""
    provider_limits: bool = True
    """Whether provider back-pressure and the shared limits are on (`CHATQ_PROVIDER_LIMITS`, `on`/`off`);
    off, a 429 or 503 is an ordinary agent failure (retried once) and nothing paces requests."""
    provider_patience: float = 900.0
    """Seconds a turn keeps waiting while the model service refuses it before it fails (`CHATQ_PROVIDER_PATIENCE`)."""
    webhook_secret: str | None = field(default=None, repr=False)
    """Key of the HMAC-SHA256 signature of webhook deliveries (`CHATQ_WEBHOOK_SECRET`; unset: sent unsigned)."""
    webhook_allow_private: bool = False
    """Whether webhooks may go to private, loopback and link-local addresses (`CHATQ_WEBHOOK_ALLOW_PRIVATE`)."""
    webhook_timeout: float = 5.0
    """Seconds one delivery attempt may take, connecting and answering (`CHATQ_WEBHOOK_TIMEOUT`)."""
    webhook_retry_for: float = 3_600.0
    """Seconds after a delivery's first attempt during which it is retried (`CHATQ_WEBHOOK_RETRY_FOR`)."""
    webhook_backoff: float = 5.0
    """Seconds before a delivery's first retry, doubling each time up to 10 minutes (`CHATQ_WEBHOOK_BACKOFF`)."""
    webhook_concurrency: int = 32
    """Deliveries one worker process sends at once; more wait in the queue (`CHATQ_WEBHOOK_CONCURRENCY`;
    default a quarter of `CHATQ_WORKER_CONCURRENCY`, so slow receivers never take most turn threads)."""

    retention_days: float | None = None
    """Sessions idle longer than this many days are purged by the sweep (`CHATQ_RETENTION_DAYS`; unset: kept)."""

    def session_model(self, model: str | None) -> str:
        """The model a session runs on here: its own, or `default_model` when it names none (NULL)."""
        return (model or "").strip() or self.default_model

    def model_unavailable(self, model: str) -> str | None:
        """Why `model` cannot run with this configuration, or None when it can.

        Every model but `echo` needs an OpenAI-compatible server: `OPENAI_API_KEY` or `OPENAI_BASE_URL`.
        """
        return openai_model_unavailable(model, api_key=self.openai_api_key, base_url=self.openai_base_url)

    @property
    def renewal_interval(self) -> float:
        """Seconds between renewals of a process's leases (all of them in one query): a third of the
        lease, at most a second. The store's window for turns that stopped together is built on it."""
        return min(1.0, self.lease_seconds / 3)

    @property
    def redis_url_masked(self) -> str:
        """The Redis URL with any password replaced, safe for logs."""
        return mask_url(self.redis_url)

    @property
    def database_url_masked(self) -> str:
        """The database URL with any password replaced, safe for logs."""
        return mask_url(self.database_url)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Parse and validate settings from `env` (by default the process environment, filled from the env
    files: `chatq.envfile.resolved_environ`)."""
    env = resolved_environ() if env is None else env
    api_key = (env.get("OPENAI_API_KEY") or "").strip() or None
    default_model = (env.get("CHATQ_MODEL") or "").strip() or (DEFAULT_OPENAI_MODEL if api_key else ECHO_MODEL)
    base_url = (env.get("OPENAI_BASE_URL") or "").strip() or None
    if base_url is not None and urlsplit(base_url).scheme not in ("http", "https"):
        raise ConfigError(f"OPENAI_BASE_URL must be an http(s) URL, got {mask_url(base_url)!r}")
    database_url = env_url(env, "DATABASE_URL", DEFAULT_DATABASE_URL, ("postgresql+psycopg", "postgresql"))
    if database_url.startswith("postgresql://"):
        # Users paste libpq URLs; SQLAlchemy would pick psycopg2, which chatq does not install.
        database_url = "postgresql+psycopg://" + database_url[len("postgresql://") :]
    concurrency = env_int(env, "CHATQ_WORKER_CONCURRENCY", 128, minimum=1)
    settings = Settings(
        database_url=database_url,
        redis_url=env_url(env, "REDIS_URL", DEFAULT_REDIS_URL, ("redis", "rediss", "unix")),
        default_model=default_model,
        openai_api_key=api_key,
        openai_base_url=base_url,
        turn_timeout=env_float(env, "CHATQ_TURN_TIMEOUT", 120.0, minimum=0.1),
        approval_timeout=env_float(env, "CHATQ_APPROVAL_TIMEOUT", 86_400.0, minimum=0.1),
        max_content_chars=env_int(env, "CHATQ_MAX_CONTENT_CHARS", 100_000, minimum=1),
        max_images=env_int(env, "CHATQ_MAX_IMAGES", 4, minimum=0),
        max_image_bytes=env_int(env, "CHATQ_MAX_IMAGE_BYTES", 5_000_000, minimum=1),
        history_tokens=env_int(env, "CHATQ_HISTORY_TOKENS", 6_000, minimum=0),
        max_attempts=env_int(env, "CHATQ_MAX_ATTEMPTS", 2, minimum=1),
        retry_delay=env_float(env, "CHATQ_RETRY_DELAY", 1.0, minimum=0.0),
        lease_seconds=env_float(env, "CHATQ_LEASE_SECONDS", 30.0, minimum=1.0),
        max_deliveries=env_int(env, "CHATQ_MAX_DELIVERIES", 3, minimum=1),
        sweep_interval=env_float(env, "CHATQ_SWEEP_INTERVAL", 10.0, minimum=0.2),
        due_interval=env_float(env, "CHATQ_DUE_INTERVAL", 1.0, minimum=0.1),
        worker_sweep=env_switch(env, "CHATQ_WORKER_SWEEP", default=True),
        thread_share=env_switch(env, "CHATQ_THREAD_SHARE", default=True),
        requeue_grace=env_float(env, "CHATQ_REQUEUE_GRACE", 30.0, minimum=0.0),
        schedule_misfire_grace=env_float(env, "CHATQ_SCHEDULE_MISFIRE_GRACE", 10.0, minimum=0.0),
        event_retention=env_int(env, "CHATQ_EVENT_RETENTION", 3_600, minimum=600),
        text_coalesce_ms=env_float(env, "CHATQ_TEXT_COALESCE_MS", 0.0, minimum=0.0),
        worker_concurrency=concurrency,
        max_tool_output_chars=env_int(env, "CHATQ_MAX_TOOL_OUTPUT_CHARS", 20_000, minimum=100),
        plugins=env_modules(env, "CHATQ_PLUGINS"),
        metrics_port=env_port(env, "CHATQ_METRICS_PORT"),
        metrics_addr=env_address(env, "CHATQ_METRICS_ADDR", "127.0.0.1"),
        log_format=env_choice(env, "CHATQ_LOG_FORMAT", ("auto", "json", "text")),
        vision_models=env_names(env, "CHATQ_VISION_MODELS"),
        prices=(env.get("CHATQ_PRICES") or "").strip() or None,
        retention_days=env_optional_float(env, "CHATQ_RETENTION_DAYS", minimum=0.001),
        model_limits=parse_model_limits(env.get("CHATQ_MODEL_LIMITS")),
        tenant_weights=parse_tenant_weights(env.get("CHATQ_TENANT_WEIGHTS")),
        tenant_budgets=parse_tenant_budgets(env.get("CHATQ_TENANT_BUDGETS")),
        provider_limits=env_switch(env, "CHATQ_PROVIDER_LIMITS", default=True),
        provider_patience=env_float(env, "CHATQ_PROVIDER_PATIENCE", 900.0, minimum=0.0),
        webhook_secret=(env.get("CHATQ_WEBHOOK_SECRET") or "").strip() or None,
        webhook_allow_private=env_switch(env, "CHATQ_WEBHOOK_ALLOW_PRIVATE", default=False),
        webhook_timeout=env_float(env, "CHATQ_WEBHOOK_TIMEOUT", 5.0, minimum=0.1, maximum=60.0),
        webhook_retry_for=env_float(env, "CHATQ_WEBHOOK_RETRY_FOR", 3_600.0, minimum=0.0),
        webhook_backoff=env_float(env, "CHATQ_WEBHOOK_BACKOFF", 5.0, minimum=0.01),
        webhook_concurrency=env_int(env, "CHATQ_WEBHOOK_CONCURRENCY", max(1, concurrency // 4), minimum=1),
    )
    return settings


_settings: PerProcess[Settings] = PerProcess(load_settings)


def get_settings() -> Settings:
    """The settings of this process, parsed on first use and then kept (`chatq.per_process`)."""
    return _settings.get()


def reset_settings() -> None:
    """Forget the cached settings (tests that change the environment call this)."""
    _settings.reset()
