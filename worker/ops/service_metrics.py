"""One metrics endpoint for every process of `chatq worker` (prometheus_client's multiprocess mode).

The supervisor (worker/cli/supervisor.py) makes a fresh directory for its service and starts each
Celery process with `PROMETHEUS_MULTIPROC_DIR` naming it and `CHATQ_METRICS_PORT` empty, so no
process binds the port: prometheus_client, seeing the variable when it is imported, keeps each
process's values in files there. The supervisor serves the one endpoint on `CHATQ_METRICS_PORT`,
which sums the files at each scrape (`service_registry`); when a process ends it drops that
process's live gauges (`chatq_turns_in_flight`) while its counters keep counting, and when the
service stops it removes the directory (a service killed with -9 leaves it to the next service's
start, which removes the directories of supervisors that no longer run).

The provider gauges are read from Redis at scrape time for the scopes (model at base URL) the
processes sent turns under, which each lists in the same directory (`worker.ops.metrics.share_scopes`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from worker.ops.metrics import (
    DIRECTORY_ENV,
    ProviderLimitsCollector,
    QueueDepthCollector,
    shared_scopes,
    start_endpoint,
)

log = logging.getLogger(__name__)

DIRECTORY_PREFIX = "chatq-metrics-"
"""A service's directory is `chatq-metrics-<supervisor pid>-<random>` in the temporary directory."""


@dataclass(kw_only=True)
class ServiceMetrics:
    """The multiprocess directory and the endpoint of one `chatq worker` service."""

    directory: Path
    """Where the service's processes write their metric values."""
    server: WSGIServer | None = None
    """The endpoint; None when its port could not be bound (logged as an error)."""

    @classmethod
    def start(cls, *, port: int, addr: str) -> ServiceMetrics:
        """Make a fresh directory and serve it on addr:port (before any process of the service starts)."""
        remove_stale_directories()
        directory = Path(tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-"))
        registry = service_registry(str(directory))
        # One collection now imports everything a scrape needs, so the endpoint's thread does no
        # first-time imports while the supervisor starts processes.
        list(registry.collect())
        return cls(directory=directory, server=start_endpoint(port, addr, registry))

    def child_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """A process's environment: write metrics to the directory, serve none itself."""
        return {**environ, DIRECTORY_ENV: str(self.directory), "CHATQ_METRICS_PORT": ""}

    def process_ended(self, pid: int) -> None:
        """A process of the service ended: its live gauges stop counting (its counters stay)."""
        try:
            mark_process_dead(pid, str(self.directory))  # type: ignore[no-untyped-call]
        except OSError as exc:  # the scrape may read the file as it goes
            log.warning("could not drop the metrics of process %d: %s", pid, exc)

    def close(self) -> None:
        """Stop the endpoint and remove the directory (the service has stopped)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)


def remove_stale_directories() -> None:
    """Remove the directories of this user's services whose supervisor no longer runs (killed -9)."""
    for path in Path(tempfile.gettempdir()).glob(f"{DIRECTORY_PREFIX}*-*"):
        pid = path.name[len(DIRECTORY_PREFIX) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or path.stat().st_uid != os.getuid() or _running(int(pid)):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def service_registry(directory: str) -> CollectorRegistry:
    """What the one endpoint of `chatq worker`'s processes serves: the metrics every process wrote
    to `directory` (prometheus_client's multiprocess files), summed, and the gauges read from Redis."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(QueueDepthCollector())
    registry.register(ProviderLimitsCollector(lambda: shared_scopes(Path(directory))))
    return registry
