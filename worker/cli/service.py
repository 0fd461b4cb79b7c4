"""`chatq worker` with several processes: what they share, set up around the supervisor.

Node names no other service on this host holds (worker/cli/node_names.py), and, with
`CHATQ_METRICS_PORT`, one metrics endpoint for all of them (worker/ops/service_metrics.py); both
are released when the supervisor (worker/cli/supervisor.py) returns.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

from chatq.settings import Settings
from worker.cli.node_names import claim_node_names
from worker.cli.supervisor import Supervisor, child_arguments
from worker.ops.service_metrics import ServiceMetrics


def run_service(
    arguments: Sequence[str], count: int, *, command: Callable[[list[str]], list[str]], settings: Settings
) -> int:
    """Run `count` Celery workers given `arguments` (`command` makes each one's command line) as one
    service, by the CLI's `settings`; returns its exit status."""
    nodes = claim_node_names(arguments, count)
    if nodes.taken:
        sys.stderr.write(
            f"chatq worker: {', '.join(nodes.taken)} run in another service on this host; "
            f"this one runs {', '.join(nodes.names)}\n"
        )
    commands = [command(child_arguments(arguments, index)) for index in nodes.indexes]
    metrics = None
    try:
        if settings.metrics_port is not None:
            _log_to_stderr(settings)
            metrics = ServiceMetrics.start(port=settings.metrics_port, addr=settings.metrics_addr)
        return Supervisor(
            commands=commands,
            env=metrics.child_environment(os.environ) if metrics else None,
            on_exit=metrics.process_ended if metrics else None,
        ).run()
    finally:
        if metrics is not None:
            metrics.close()
        nodes.release()


def _log_to_stderr(settings: Settings) -> None:
    """The supervisor's own log lines (its metrics endpoint's), formatted as its workers' are."""
    from worker.ops.logs import configure_handlers

    root = logging.getLogger()
    root.addHandler(logging.StreamHandler())
    root.setLevel(logging.INFO)
    configure_handlers(root, log_format=settings.log_format)
