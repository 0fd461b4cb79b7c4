"""`python -m bench [NAME ...] [--repeat N] [--services auto|private|shared] [--json FILE]`.

Without names every benchmark runs, each in its own Python process (fresh settings, engine and
Celery app; a crash or a hang in one cannot take the others down) with a time limit. Figures are
printed as blocks (target, figure, baseline, ratio, verdict) and as a summary table at the end.
Nothing here asserts an absolute time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = ("io_concurrency", "pipeline_overhead", "stream_latency", "dispatch", "history_scale", "session_pages")
"""What runs without names."""
OPTIONAL = (
    "peer",
    "processes",
    "provider_limits",
    "durability",
    "approvals",
    "schedules",
    "raw_intake",
    "fairness",
)
"""Run only when named: `peer` needs LangGraph's server installed (`make bench-peer` runs it);
`processes` is the measurement behind `chatq worker`'s default of a process per core;
`provider_limits` is a 600-turn batch at a provider's 300 requests per minute (minutes per variant);
`durability` is 200 turns of four tool rounds four times over (with and without the journal, with
and without kill -9 of workers); `approvals` is a decision -> the resumed turn's first model request
against a fresh submit's (issue 29); `schedules` is one `every=5` schedule for 60 s on two workers, tick ->
its turn's claim and first model request (issue 30); `raw_intake` is a raw task message's turn against
the producer API's, in-process, CPU and round trips to Postgres (issue 32); `fairness` is four tenants on
one rate-limited model, with and without tenants on their sessions (issue 31)."""
TIME_LIMIT = {
    "peer": 7200,
    "processes": 900,
    "provider_limits": 1500,
    "fairness": 1800,
    "durability": 1800,
    "approvals": 300,
    "schedules": 240,
    "raw_intake": 600,
    "io_concurrency": 150,
    "pipeline_overhead": 150,
    "stream_latency": 150,
    "dispatch": 120,
    "history_scale": 120,
    "session_pages": 240,
}


def machine() -> dict[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cores": str(os.cpu_count()), "cpu": cpu, "python": platform.python_version()}


def run_one(name: str, quick: bool) -> list[dict[str, Any]]:
    """Run one benchmark in this process and print its blocks."""
    from bench import public_api
    from bench.common import git_revision, print_block

    public_api.apply()
    module = importlib.import_module(f"bench.{name}")
    off = f", public API for {', '.join(public_api.names())}" if public_api.names() else ""
    print(f"\n### {name} (revision {git_revision()}{off})", flush=True)
    started = time.monotonic()
    blocks = module.run(quick=quick)
    for block in blocks:
        print_block(block)
    print(f"   ({name} took {time.monotonic() - started:.0f} s)", flush=True)
    return [block.as_dict() for block in blocks]


def run_child(name: str, quick: bool) -> list[dict[str, Any]]:
    """Run one benchmark in a child process with a time limit, once more if it crashed (a shared
    Postgres or Redis restarted under it, say); its blocks come back as JSON."""
    rows = _child(name, quick)
    if rows and str(rows[0].get("verdict", "")).startswith("ERROR"):
        print(f"!! {name}: running it once more", flush=True)
        rows = _child(name, quick)
    return rows


def _child(name: str, quick: bool) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        path = out.name
    command = [sys.executable, "-m", "bench", name, "--services", "shared", "--json", path]
    if quick:
        command.append("--quick")
    try:
        process = subprocess.Popen(command, start_new_session=True)
        try:
            code = process.wait(TIME_LIMIT[name])
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            print(f"!! {name}: over its {TIME_LIMIT[name]} s limit, stopped", flush=True)
            return [{"name": name, "verdict": "TIMEOUT"}]
        if code != 0:
            print(f"!! {name}: exited {code}", flush=True)
            return [{"name": name, "verdict": f"ERROR (exit {code})"}]
        results: list[dict[str, Any]] = json.loads(Path(path).read_text() or "[]")
        return results
    finally:
        Path(path).unlink(missing_ok=True)


def summary(rows: list[dict[str, Any]]) -> None:
    print("\n### summary")
    print(f"{'benchmark':<36} {'figure':>12} {'baseline':>12} {'ratio':>8} {'limit':>7}  verdict")
    for row in rows:
        if "figure" not in row:
            print(f"{row['name']:<36} {'':>12} {'':>12} {'':>8} {'':>7}  {row['verdict']}")
            continue
        unit = row["unit"]
        limit = f"{row['limit']:.2f}" if row["limit"] is not None else "-"
        print(
            f"{row['name']:<36} {row['figure']:>10.4g} {unit:<1} {row['baseline']:>10.4g} {unit:<1} "
            f"{row['ratio']:>7.3f}x {limit:>7}  {row['verdict']}"
        )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="chatq benchmarks (issue 6)")
    parser.add_argument("names", nargs="*", metavar="NAME", help="any of: " + ", ".join(BENCHMARKS + OPTIONAL))
    parser.add_argument("--repeat", type=int, default=1, help="run each benchmark N times (shows the spread)")
    parser.add_argument(
        "--services",
        choices=("auto", "private", "shared"),
        default="auto",
        help="private: start an own redis-server + Postgres cluster (stock settings, free ports) for the run, "
        "safe from neighbours restarting or loading the shared ones; shared: DATABASE_URL/REDIS_URL as given; "
        "auto (default): private when redis-server, initdb and pg_ctl are installed, else shared",
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run, not for figures)")
    parser.add_argument("--json", help="write the result blocks to this file")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy the worker (and cProfile this process) during measured phases; writes DIR/*.txt "
        "(figures of a profiled run are distorted)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS + OPTIONAL]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHMARKS + OPTIONAL)}")
    names = list(args.names) or list(BENCHMARKS)
    if args.profile:
        os.environ["CHATQ_BENCH_PROFILE"] = str(Path(args.profile).resolve())

    from bench.services import describe, private_available, private_services

    mode = args.services
    if mode == "auto":
        mode = "private" if private_available() else "shared"
    stack = contextlib.ExitStack()
    with stack:
        if mode == "private" and not os.environ.get("CHATQ_BENCH_CHILD"):
            os.environ.update(stack.enter_context(private_services()))
        os.environ["CHATQ_BENCH_CHILD"] = "1"
        single = len(names) == 1 and args.repeat == 1
        if not os.environ.get("CHATQ_BENCH_HEADER"):
            os.environ["CHATQ_BENCH_HEADER"] = "1"
            info = {
                **machine(),
                **describe(
                    os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@localhost:5432/chatq"),
                    os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
                    mode,
                ),
            }
            print("chatq benchmarks: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
        rows: list[dict[str, Any]] = []
        for round_ in range(args.repeat):
            for name in names:
                if args.repeat > 1:
                    print(f"\n--- round {round_ + 1}/{args.repeat}", flush=True)
                rows.extend(run_one(name, args.quick) if single else run_child(name, args.quick))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        if not single:
            summary(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
