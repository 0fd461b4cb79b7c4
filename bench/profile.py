"""Where the time goes: py-spy on a worker, cProfile in-process, and a summary of both.

`python -m bench NAME --profile DIR` records the worker with py-spy (`record --format raw`, idle
threads excluded) during the measured phase and writes DIR/NAME-*.txt (collapsed stacks) and a
summary of the top functions by inclusive and by self samples. Profiling slows the worker, so the
figures of a profiled run are for orientation only (the report says so).
CHATQ_BENCH_PROFILE_RATE sets py-spy's samples per second (default 100), CHATQ_BENCH_PROFILE_DURATION
stops it after that many seconds (to catch only a ramp), and CHATQ_BENCH_PROFILE_GIL=0 samples every
running thread instead of the one holding the interpreter lock.

`python -m bench.profile FILE.txt [--top N] [--filter SUBSTRING]` summarises a raw file again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_CHECKOUT = f"{Path(__file__).resolve().parents[1]}/"
"""This checkout's directory: frames of chatq's own files are shown relative to it."""

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def profile_dir() -> Path | None:
    value = os.environ.get("CHATQ_BENCH_PROFILE")
    return Path(value) if value else None


@contextlib.contextmanager
def record(pid: int, name: str, rate: int | None = None) -> Iterator[Path | None]:
    """py-spy record the process while the block runs (only when --profile was given).

    The sampling rate is `rate`, else CHATQ_BENCH_PROFILE_RATE, else 100 a second.
    """
    directory = profile_dir()
    rate = rate or int(os.environ.get("CHATQ_BENCH_PROFILE_RATE", "100"))
    tool = py_spy()
    if directory is None or tool is None:
        yield None
        return
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}.txt"
    process = subprocess.Popen(
        [
            tool,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            *(["--gil"] if os.environ.get("CHATQ_BENCH_PROFILE_GIL", "1") == "1" else []),
            *(["--duration", duration] if (duration := os.environ.get("CHATQ_BENCH_PROFILE_DURATION")) else []),
            "--nonblocking",
            "--format",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)  # attached
    try:
        yield out
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        if out.exists():
            summary = summarize(out)
            (directory / f"{name}.summary.txt").write_text(summary)
            print(summary, flush=True)


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m["file"]
    for marker in ("site-packages/", _CHECKOUT, "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m['func']} ({path})"


def summarize(path: Path, top: int = 30, only: str | None = None) -> str:
    """Top functions by inclusive and self samples of a py-spy raw (collapsed) file."""
    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f.strip()]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        for f in set(frames):
            inclusive[f] += count
        self_[frames[-1]] += count
    lines = [f"py-spy {path.name}: {total} samples (active threads only)"]
    lines.append("  inclusive  self   function")
    shown = 0
    for func, count in inclusive.most_common():
        if only and only not in func:
            continue
        lines.append(f"  {100 * count / max(total, 1):6.1f}% {100 * self_[func] / max(total, 1):6.1f}%  {func}")
        shown += 1
        if shown >= top:
            break
    lines.append("  top by self:")
    for func, count in self_.most_common(top // 2):
        lines.append(f"  {100 * count / max(total, 1):6.1f}%  {func}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="summarise a py-spy raw profile")
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--filter", default=None)
    args = parser.parse_args(argv)
    print(summarize(Path(args.file), args.top, args.filter))


if __name__ == "__main__":
    main()
