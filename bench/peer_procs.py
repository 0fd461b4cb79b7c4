"""What the side-by-side reads from /proc: process trees, their CPU, their memory, who listens on a port.

Both sides are read the same way: a process tree's CPU is every live process's user + system time
plus what its reaped children used (Postgres backends that exited count), and its memory is the
sum of each process's proportional set size (PSS: a page shared by N processes counts 1/N in
each, so Postgres's shared buffers are not counted once per backend), RSS where PSS is unreadable.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from urllib.parse import urlsplit

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name (which may hold spaces and ')')."""
    return text.rsplit(")", 1)[1].split()


def stat_cpu_ticks(fields: list[str]) -> int:
    """utime + stime + cutime + cstime of `stat_fields` (the process and its reaped children)."""
    return sum(int(x) for x in fields[11:15])


def pss_kib(smaps_rollup: str) -> int | None:
    """The `Pss:` line of /proc/<pid>/smaps_rollup, in KiB; None when there is none."""
    match = re.search(r"^Pss:\s+(\d+) kB", smaps_rollup, re.MULTILINE)
    return int(match.group(1)) if match else None


def port_of(url: str) -> int:
    """The port of a service URL (`postgresql+psycopg://u@host:5433/db`, `redis://host:6380/3`), or its default."""
    parts = urlsplit(url)
    return parts.port or (6379 if parts.scheme.startswith("redis") else 5432)


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return stat_fields(f.read())
    except OSError:
        return None


def tree(root: int) -> list[int]:
    """`root` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds used by these process trees, children that exited and were reaped included."""
    total = 0
    for root in roots:
        for pid in tree(root):
            fields = _stat(pid)
            if fields:
                total += stat_cpu_ticks(fields)
    return total / CLOCK_TICKS


def process_memory_kib(pid: int) -> int:
    """PSS of one process in KiB (RSS when smaps_rollup cannot be read); 0 when it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        pss = pss_kib(f.read())
        if pss is not None:
            return pss
    with contextlib.suppress(OSError), open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE_KIB
    return 0


def tree_memory_kib(roots: list[int]) -> int:
    """Memory (PSS) of every process of these trees."""
    return sum(process_memory_kib(pid) for root in roots for pid in tree(root))


def tree_size(root: int) -> int:
    """How many processes the tree of `root` holds now."""
    return len(tree(root))


def listener_pid(port: int) -> int:
    """The pid of the process listening on 127.0.0.1:port (the private Postgres or Redis)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                    inodes.add(parts[9])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{entry}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(entry)
    raise RuntimeError(f"nothing listens on port {port}")


def outbound_requests(server_log: str) -> list[str]:
    """Requests the server's HTTP clients logged (httpx logs each at INFO) to other hosts than loopback."""
    found = re.findall(r"HTTP Request: [A-Z]+ (\S+)", re.sub(r"\x1b\[[0-9;]*m", "", server_log))
    return [url for url in found if not url.startswith(("http://127.0.0.1", "http://localhost"))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
