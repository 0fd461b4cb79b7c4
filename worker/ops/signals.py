"""Celery signal receivers: logging set-up, adapter preloading, metrics, heap freezing, hand-back on shutdown.

Imported by `worker.app`, so they are connected before the worker sets up logging. What they need
from the settings comes through the app's configuration (the `chatq_*` values of celeryconfig.py,
where a Celery process reads its settings), not from a settings read of their own.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_after_setup,
    task_received,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutting_down,
)

from chatq.masking import mask_secrets
from worker.ops.gc_freeze import freeze_startup_objects
from worker.ops.logs import configure_handlers, quiet_http_clients
from worker.runtime.recovery.leases import begin_hand_back

log = logging.getLogger(__name__)


@after_setup_logger.connect
def _setup_logging(logger: logging.Logger, **_: Any) -> None:
    configure_handlers(logger, log_format=current_app.conf.chatq_log_format)
    quiet_http_clients()


@after_setup_task_logger.connect
def _setup_task_logging(logger: logging.Logger, **_: Any) -> None:
    configure_handlers(logger, log_format=current_app.conf.chatq_log_format)


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """Import the agent adapters once at start (the first turn would pay seconds of imports)."""
    from handlers import framework_names, load_handler_class
    from worker.events import get_redis
    from worker.runtime.intake.bindings import drop_stray_bindings

    for framework in framework_names():
        try:
            load_handler_class(framework)
        except Exception as exc:  # a broken adapter fails its own turns, not the worker
            log.warning("could not preload the %s handler: %s", framework, exc)
    try:
        # Before a retry can follow one (the consumer declares the queues themselves).
        drop_stray_bindings(get_redis(), tuple(sender.app.conf.task_queues))
    except Exception as exc:  # Redis may not be up yet; every sweep does it again
        log.warning("could not check the queue bindings: %s", mask_secrets(str(exc)))


@celeryd_after_setup.connect
def _serve_metrics(conf: Any = None, **_: Any) -> None:
    """Start the metrics endpoint if CHATQ_METRICS_PORT is set: after logging is set up (not at
    worker_init), so a port that cannot be bound is an ERROR line in the worker's log."""
    from worker.ops.metrics import serve_metrics

    serve_metrics(conf.chatq_metrics_port, conf.chatq_metrics_addr)


@worker_ready.connect
@worker_process_init.connect
def _freeze_startup_heap(**_: Any) -> None:
    """Start-up is over (in a prefork child, at its fork): keep what it built out of full GC passes."""
    frozen = freeze_startup_objects()
    log.info("froze %d start-up objects out of the garbage collector's full passes", frozen)


@worker_shutting_down.connect
def _hand_back_on_shutdown(sig: str | None = None, how: str | None = None, **_: Any) -> None:
    """On SIGTERM/SIGINT, running turns go back to the queue at their next chunk.

    A rolling deploy then waits for no turn to finish and loses none: each interrupted turn is
    requeued in Postgres and sent again at once, and the next worker starts it over. Dispatched on
    the `chatq-stop` thread, never inside a signal handler (worker/ops/stopping.py).
    """
    log.info("worker shutting down (%s, %s): handing running turns back", how, sig)
    begin_hand_back()


@task_received.connect
def _message_taken(request: Any = None, **_: Any) -> None:
    """The message left the queue: drop its sent-marker now, not when the task starts, so a worker
    that dies with messages reserved leaves them to the sweeper's grace period, not its patience."""
    from worker.events import get_redis
    from worker.markers import mark_taken

    task_id = getattr(request, "id", None)
    if task_id and getattr(request, "name", None) == "chatq.run_turn":
        # The list it came from (the intake sets it): a take off `chatq.batch` is counted there too.
        queue = (getattr(request, "delivery_info", None) or {}).get("routing_key")
        mark_taken(get_redis(), task_id, queue=queue)
