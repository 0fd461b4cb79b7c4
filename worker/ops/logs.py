"""Logging: JSON lines when not on a terminal, turn context on every line, secrets masked.

`CHATQ_LOG_FORMAT` = `auto` (default: JSON unless stderr is a terminal), `json` or `text`.
Every record gets the `turn_id`, `session_id` and `attempt` of the turn the thread is running
(a context variable set by the runner), and secrets in the rendered line and in tracebacks are
masked (`chatq.masking.mask_secrets`: URL passwords and the configured secret values).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from chatq.masking import mask_secrets
from worker.log_context import current_turn
from worker.runtime.observers import hooks
from worker.runtime.policy.retry import RetryCause


class LogHooks(hooks.TurnHooks):
    """The per-turn INFO/WARNING lines, from the runner's lifecycle hooks (`worker.runtime.observers.hooks`).

    They keep the logger `worker.runner` they were written under before hooks existed (and before
    the runner moved to `worker.runtime.delivery.runner`), so operators' filters on it still match. Ids,
    counts and errors only: never a prompt or a reply.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("worker.runner")

    def started(self, event: hooks.Started) -> None:
        turn = event.turn
        self.log.info(
            "turn %s session %s: attempt %d started (framework %s, model %s)",
            turn.turn_id,
            turn.session_id,
            turn.attempt,
            turn.framework,
            turn.model,
        )

    def succeeded(self, event: hooks.Succeeded) -> None:
        turn = event.turn
        self.log.info(
            "turn %s session %s: succeeded on attempt %d (%d messages, %d tokens)",
            turn.turn_id,
            turn.session_id,
            turn.attempt,
            event.messages,
            event.total_tokens,
        )

    def failed(self, event: hooks.Failed) -> None:
        turn = event.turn
        if event.at_claim:
            self.log.warning("turn %s session %s: ended poisoned at claim", turn.turn_id, turn.session_id)
            return
        self.log.warning(
            "turn %s session %s: failed after attempt %d: %s", turn.turn_id, turn.session_id, turn.attempt, event.error
        )

    def retried(self, event: hooks.Retried) -> None:
        turn = event.turn
        if event.cause is RetryCause.AGENT_FAILURE:
            self.log.warning(
                "turn %s session %s: attempt %d failed, retrying: %s",
                turn.turn_id,
                turn.session_id,
                turn.attempt,
                event.error,
            )
        elif event.cause is RetryCause.BUSY:
            self.log.info("turn %s: running elsewhere, checking again in %.1fs", turn.turn_id, event.delay)
        elif event.cause is RetryCause.PROVIDER:
            self.log.info(
                "turn %s: the model service said not now, trying again in %.1fs: %s",
                turn.turn_id,
                event.delay,
                event.error,
            )
        elif event.cause is RetryCause.SLOT:
            self.log.debug("turn %s: waiting %.2fs for a slot: %s", turn.turn_id, event.delay, event.error)
        elif event.cause is RetryCause.BUDGET:
            self.log.debug(
                "turn %s: near its tenant's budget, waiting %.2fs: %s", turn.turn_id, event.delay, event.error
            )
        else:
            self.log.warning(
                "turn %s: infrastructure error, retrying in %.0fs: %s", turn.turn_id, event.delay, event.error
            )

    def cancelled(self, event: hooks.Cancelled) -> None:
        turn = event.turn
        if event.at_claim:
            self.log.warning("turn %s session %s: ended cancelled at claim", turn.turn_id, turn.session_id)
        else:
            self.log.info("turn %s session %s: cancelled while running", turn.turn_id, turn.session_id)

    def handed_back(self, event: hooks.HandedBack) -> None:
        if event.running:
            self.log.info("turn %s session %s: handed back at shutdown", event.turn.turn_id, event.turn.session_id)

    def lost(self, event: hooks.Lost) -> None:
        turn = event.turn
        if event.storing:
            self.log.warning("turn %s: lease lost before the reply was stored; another attempt owns it", turn.turn_id)
        else:
            self.log.warning(
                "turn %s session %s: lease lost, attempt %d abandoned", turn.turn_id, turn.session_id, turn.attempt
            )

    def rejected(self, event: hooks.Rejected) -> None:
        self.log.warning("turn %s session %s: rejected: %s", event.turn_id, event.session_id, event.error)


class TurnContextFilter(logging.Filter):
    """Adds turn_id/session_id/attempt to records and masks secrets in the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current_turn()
        for key in ("turn_id", "session_id", "attempt"):
            if not hasattr(record, key):
                setattr(record, key, context.get(key))
        rendered = record.getMessage()
        masked = mask_secrets(rendered)
        if masked != rendered:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            # Formatters reuse `exc_text`: a traceback's exception text may carry a secret too.
            record.exc_text = mask_secrets(_TRACEBACKS.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = mask_secrets(record.stack_info)
        return True


_TRACEBACKS = logging.Formatter()


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for key in ("turn_id", "session_id", "attempt", "task_id", "task_name"):
            value = getattr(record, key, None)
            if value not in (None, "", "???"):
                payload[key] = value
        if record.exc_info:
            payload["exception"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(payload, default=str, ensure_ascii=False)


QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
"""HTTP client loggers held at WARNING unless configured: httpx logs every model request at INFO."""


def quiet_http_clients() -> None:
    """Hold the HTTP client loggers at WARNING, unless something already set their level.

    One INFO line per model request repeats what chatq's own turn lines say, and at hundreds of
    turns a second it is log volume and CPU for nothing. Set `logging.getLogger("httpx2")` to
    INFO (or DEBUG) before the worker starts to see them again.
    """
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def use_json(log_format: str, stream: Any = None) -> bool:
    """Whether log lines should be JSON under `log_format` (`CHATQ_LOG_FORMAT`: auto, json or text)."""
    if log_format in ("json", "text"):
        return log_format == "json"
    stream = stream or sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


def configure_handlers(logger: logging.Logger, *, log_format: str) -> None:
    """Install chatq's filter (and the JSON formatter when `log_format` wants it) on a logger's handlers."""
    configure_filters(logger)
    if use_json(log_format):
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())


def configure_filters(logger: logging.Logger) -> None:
    """Install chatq's filter (turn context, secrets masked) on a logger's handlers, once."""
    for handler in logger.handlers:
        if not any(isinstance(f, TurnContextFilter) for f in handler.filters):
            handler.addFilter(TurnContextFilter())
