"""Node names no other `chatq worker` on this host holds.

A supervised service names its processes `name-1@host`, `name-2@host`, ... Two services started on
one host with the same (or the default) name would run two Celery nodes under each name: Celery only
warns (`celery status`), and chatq's crash accounting, which tells workers apart by the name a turn
records, would blame one service's crash on the other's turns. So each service holds its names
while it runs, as abstract Unix sockets (Linux: bound once per network namespace, released by the
kernel when the holder ends, however it ends), and takes the next free numbers when some are
held: a second default service on a host runs `celery-3@host`, `celery-4@host`. A single worker
(`--processes 1`, where `chatq worker` becomes Celery) holds its one name across the exec, and a
second one under the same name is refused. Elsewhere than Linux the names are not checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from celery.utils.nodenames import default_nodename, host_format

from worker.cli.supervisor import HOSTNAME_OPTIONS, child_arguments
from worker.errors import CliError

MAX_INDEX = 1024
"""The highest process number tried for a name."""


def celery_node_name(arguments: Sequence[str]) -> str:
    """The node name Celery gives a worker started with `arguments` (`%h` expanded)."""
    value = ""  # Celery's default: celery@<this host>
    for position, item in enumerate(arguments):
        if item in HOSTNAME_OPTIONS and position + 1 < len(arguments):
            value = arguments[position + 1]
        elif item.startswith("--hostname="):
            value = item.split("=", 1)[1]
    return str(host_format(default_nodename(value)))


def node_name(arguments: Sequence[str], index: int) -> str:
    """The node name Celery gives child `index` of a service started with `arguments`."""
    return celery_node_name(child_arguments(arguments, index))


def hold_name(name: str) -> socket.socket | None:
    """Hold `name` on this host; None if another process holds it."""
    # Abstract names are at most 107 bytes; a digest fits any node name.
    address = "\0chatq-node-" + hashlib.sha256(name.encode()).hexdigest()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        return None
    return sock


_kept: list[socket.socket] = []
"""The name held for the Celery worker this process becomes (`hold_for_exec`)."""


def hold_for_exec(arguments: Sequence[str]) -> None:
    """Hold the node name of the one Celery worker this process is about to become (`os.execv`),
    or refuse clearly if another worker on this host holds it. The worker keeps holding it."""
    if not sys.platform.startswith("linux"):
        return
    name = celery_node_name(arguments)
    sock = hold_name(name)
    if sock is None:
        raise CliError(f"{name} already runs on this host (another chatq worker); give this one its own --hostname")
    os.set_inheritable(sock.fileno(), True)  # open across exec: the Celery worker holds the name
    _kept.append(sock)


@dataclass(kw_only=True)
class NodeNames:
    """The process numbers a service may use, held until `release` (or the process ends)."""

    indexes: list[int]
    """The numbers of its processes (1, 2, ... unless another service holds some)."""
    names: list[str]
    """Their node names, in the same order."""
    taken: list[str] = field(default_factory=list)
    """Names skipped because another service on this host holds them."""
    held: list[socket.socket] = field(default_factory=list)
    """What holds the names."""

    def release(self) -> None:
        """Let other services use the names (the service has stopped)."""
        for sock in self.held:
            with contextlib.suppress(OSError):
                sock.close()
        self.held.clear()


def claim_node_names(arguments: Sequence[str], count: int) -> NodeNames:
    """The first `count` process numbers whose node names no other service on this host holds."""
    if not sys.platform.startswith("linux"):
        indexes = list(range(1, count + 1))
        return NodeNames(indexes=indexes, names=[node_name(arguments, i) for i in indexes])
    claimed = NodeNames(indexes=[], names=[])
    index = 0
    while len(claimed.indexes) < count:
        index += 1
        if index > MAX_INDEX:
            claimed.release()
            raise CliError(f"no {count} free node names on this host: {len(claimed.taken)} are held by other services")
        name = node_name(arguments, index)
        sock = hold_name(name)
        if sock is None:
            claimed.taken.append(name)
            continue
        claimed.indexes.append(index)
        claimed.names.append(name)
        claimed.held.append(sock)
    return claimed
