"""A batch against a rate-limited provider: failed turns, throughput against the limit, 429 share.

`python -m bench.provider_limits [--turns 600] [--rpm 300] [--window S] [--variants adaptive,configured,baseline]`
(also `python -m bench provider_limits`). The model service is the test stub with a server-wide
requests-per-minute limit (a token bucket holding one second's worth, as providers enforce a
per-minute limit over short windows), answering 429 with `Retry-After` and `x-ratelimit-*`
headers. With `--window S` the limit is a fixed window instead: `rpm * S / 60` requests in S
seconds from a window's first request, 429 beyond with `Retry-After` (whole seconds) and
`x-ratelimit-reset-requests` until the window frees (issue 34's provider is
`--turns 360 --rpm 120 --window 60`; `--turns 120 --rpm 120 --window 20` is the same shape in a
third of the time). Two `chatq worker` processes (8 threads each) run a batch of one-turn sessions on the
`chatq.batch` queue; half-way through, one interactive turn is submitted and its wait for a slot
(submit to its `started` event) is measured against the limit's interval (60 / rpm seconds).

Variants, each on fresh services in the same run:

- `adaptive`: no `CHATQ_MODEL_LIMITS` (the fleet learns the limit from the 429s);
- `configured`: `CHATQ_MODEL_LIMITS={"MODEL": {"rpm": RPM}}`;
- `baseline`: `CHATQ_PROVIDER_LIMITS=off`, the behaviour before this change (a 429 is an agent
  failure, retried once a second later, then the turn fails).

Throughput is completed turns per minute over the batch's span (first submit to last finish) and
over its steady state (after the first minute, or the first window), divided by the limit.
Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

from bench.common import (
    ROOT,
    Block,
    Subprocess,
    chatq_worker,
    isolated_services,
    log,
    report,
    run_warmup,
    use_stub,
)

MODEL = "gpt-4o-mini"
WARMUP_MODEL = "warm-up"
"""A model name of its own for the warm-up turns, so the batch's model starts with no limits state."""
VARIANTS = ("adaptive", "configured", "baseline")


class LimitedStub(Subprocess):
    """tests.support.openai_stub with server-wide limits, in its own process."""

    def __init__(self, *, rpm: float, latency: float, window: float | None = None) -> None:
        command = [sys.executable, "-m", "tests.support.openai_stub", "--rpm", str(rpm), "--latency", str(latency)]
        if window:
            command += ["--window", str(window)]
        super().__init__("limited-stub", [*command, "--record", "off"], os.environ, ready="http://")
        self.base_url = ""

    def start(self, timeout: float = 30.0) -> LimitedStub:
        super().start(timeout)
        self.base_url = self.log().strip().splitlines()[0]
        return self

    def reset(self) -> None:
        """Refill the stub's limits (a new window, a full bucket); its counts stay."""
        request = urllib.request.Request(self.base_url.removesuffix("/v1") + "/_provider", method="DELETE")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def answers(self) -> list[tuple[float, int]]:
        """(time, status) of every request the stub answered, read from its counts."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/_provider/answers", timeout=10) as r:
            return [(float(at), int(status)) for at, status in json.loads(r.read())]


def run_variant(
    variant: str,
    *,
    turns: int,
    rpm: float,
    latency: float,
    window: float | None = None,
    time_limit: float | None = None,
) -> dict[str, Any]:
    """One batch on fresh services (at most `time_limit` seconds of it); returns its figures."""
    from models.db import session_scope
    from models.tables import Turn
    from worker.producer import create_session, submit_turn

    stub_process = LimitedStub(rpm=rpm, latency=latency, window=window)
    with isolated_services(f"provider_{variant}") as services, stub_process as stub:
        stub.start()
        use_stub(stub.base_url)
        env = {**services, "OPENAI_BASE_URL": stub.base_url, "CHATQ_PROVIDER_PATIENCE": "900"}
        if variant == "configured":
            env["CHATQ_MODEL_LIMITS"] = json.dumps({MODEL: {"rpm": rpm}})
        if variant == "baseline":
            env["CHATQ_PROVIDER_LIMITS"] = "off"
        workers = [chatq_worker(concurrency=8, env=env, name=f"prov{i}") for i in range(2)]
        try:
            for worker in workers:
                worker.start()
            # A few turns first, so each worker has imported its model client before the batch: the
            # first turn of a process spends a second or two importing it, and the requests whose slots
            # were granted meanwhile would leave together afterwards.
            run_warmup(None, [WARMUP_MODEL], turns_each=6)
            time.sleep(2.0)  # the provider's bucket refills; the warm-up's requests are not counted
            stub.reset()  # nor do they open the provider's window
            sessions = [create_session(framework="none", model=MODEL) for _ in range(turns)]
            started = time.time()
            ids = [submit_turn(s, f"turn {i}", queue="chatq.batch").turn_id for i, s in enumerate(sessions)]
            interactive: dict[str, float] = {}
            deadline = time.monotonic() + (time_limit or turns * 60.0 / rpm * 3 + 120)
            while time.monotonic() < deadline:
                done = _finished(ids)
                if not interactive and done >= turns // 2:
                    session = create_session(framework="none", model=MODEL)
                    interactive["submitted"] = time.time()
                    interactive["turn"] = submit_turn(session, "an interactive question").turn_id.int
                if done >= turns:
                    break
                time.sleep(0.5)
            stopped = time.time()
            with session_scope() as db:
                rows = db.query(Turn.status, Turn.finished_at).filter(Turn.id.in_(ids)).all()
            waited = _interactive_wait(interactive)
            answers = [(at, status) for at, status in stub.answers() if at >= started]
        finally:
            for worker in workers:
                worker.stop()
    finished = [row.finished_at.timestamp() for row in rows if row.finished_at is not None]
    succeeded = sum(1 for row in rows if row.status.value == "succeeded")
    failed = sum(1 for row in rows if row.status.value == "failed")
    first = window or 60.0
    # A run cut short by its time limit is measured to when it stopped, not to its last finish.
    end = max(finished, default=started) if succeeded + failed == turns else stopped
    span = end - started if finished else float("nan")
    steady = [at for at in finished if at >= started + first]
    steady_span = end - (started + first) if steady and end > started + first else float("nan")
    late = [status for at, status in answers if at >= started + first]
    return {
        "variant": variant,
        "provider": f"fixed {window:g} s window" if window else "token bucket",
        "turns": turns,
        "succeeded": succeeded,
        "failed": failed,
        "unfinished": turns - succeeded - failed,
        "throughput": succeeded / span * 60 / rpm if finished else 0.0,
        "steady_throughput": len(steady) / steady_span * 60 / rpm if steady_span > 0 else float("nan"),
        "requests": len(answers),
        "refused_share": sum(1 for _, s in answers if s != 200) / max(len(answers), 1),
        "refused_share_after_1min": sum(1 for s in late if s != 200) / max(len(late), 1),
        "steady_after": first,
        "per_window": _per_window(answers, started, first),
        "refused_at": [round(at - started, 2) for at, status in answers if status != 200][:20],
        "interactive_wait": waited,
        "interval": 60.0 / rpm,
        "span": span,
    }


def _per_window(answers: list[tuple[float, int]], started: float, window: float) -> list[str]:
    """Requests answered 200 / refused in each window from the first submit: `ok/refused`."""
    counts: dict[int, list[int]] = {}
    for at, status in answers:
        counts.setdefault(int((at - started) // window), [0, 0])[0 if status == 200 else 1] += 1
    return [f"{ok}/{refused}" for _, (ok, refused) in sorted(counts.items())]


def _finished(ids: list[uuid.UUID]) -> int:
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn, TurnStatus

    with session_scope() as db:
        return int(
            db.execute(
                select(func.count())
                .select_from(Turn)
                .where(Turn.id.in_(ids), Turn.status.in_([TurnStatus.SUCCEEDED, TurnStatus.FAILED]))
            ).scalar_one()
        )


def _interactive_wait(interactive: dict[str, float]) -> float:
    """Seconds from the interactive turn's submit to its `started` event (the slot it got)."""
    if not interactive:
        return float("nan")
    from worker.events import get_redis, turn_stream

    turn_id = uuid.UUID(int=int(interactive["turn"]))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for _, fields in get_redis().xrange(turn_stream(turn_id)):
            event = json.loads(fields[b"event"])
            if event["type"] == "started":
                return float(event["ts"]) - interactive["submitted"]
        time.sleep(0.2)
    return float("nan")


def blocks(results: list[dict[str, Any]]) -> list[Block]:
    """The figures as benchmark blocks: throughput and 429 share against the targets, the rest informational."""
    base = next((r for r in results if r["variant"] == "baseline"), None)
    out: list[Block] = []
    targets = {"adaptive": (0.9, 0.05), "configured": (0.95, 0.01)}
    window_targets = {"adaptive": (0.85, 0.10), "configured": (0.85, 0.10)}
    for r in results:
        kind = "window." if r.get("provider", "token bucket") != "token bucket" else ""
        name = f"provider_limits.{kind}{r['variant']}"
        rpm = 60.0 / r["interval"]
        details = {k: v for k, v in r.items() if k not in ("variant", "refused_at")}
        chosen = window_targets if kind else targets
        throughput_target, refused_target = chosen.get(r["variant"], (None, None))
        # Against a window the first one is spent at once: the target is the rate after it.
        after = " after the first window" if kind else ""
        out.append(
            Block(
                name=f"{name}.throughput",
                target=f"completed turns/min{after} >= {throughput_target} of the limit" if throughput_target else "-",
                figure=(r["steady_throughput"] if kind else r["throughput"]) * rpm,
                baseline=rpm,
                unit="turns/min",
                limit=throughput_target,
                baseline_label="the provider's limit",
                details=details,
                higher_is_better=True,
            )
        )
        out.append(
            Block(
                name=f"{name}.refused" if kind else f"{name}.refused_after_1min",
                target=f"429 share <= {refused_target:.0%}" if refused_target else "-",
                figure=r["refused_share"] if kind else r["refused_share_after_1min"],
                baseline=1.0,
                unit="share",
                limit=refused_target,
                baseline_label="all requests",
            )
        )
        out.append(
            Block(
                name=f"{name}.failed",
                target="0 failed turns",
                figure=float(r["failed"] + r["unfinished"]),
                baseline=float(base["failed"] + base["unfinished"]) if base else float(r["turns"]),
                unit="turns",
                limit=None if r["variant"] == "baseline" else 0.0,
                baseline_label="baseline (limits off)" if base else "turns",
            )
        )
        if not math.isnan(r["interactive_wait"]):
            out.append(
                Block(
                    name=f"{name}.interactive_wait",
                    target="an interactive turn's wait for a slot, against the limit's interval",
                    figure=r["interactive_wait"],
                    baseline=r["interval"],
                    unit="s",
                    limit=None,
                    baseline_label="60 / rpm",
                )
            )
    return out


def run_apart(variant: str, **options: Any) -> dict[str, Any]:
    """`run_variant` in a Python process of its own: this process's Celery app keeps the broker of
    the first variant it sent to (celeryconfig is read once), and the next variant's Redis is another."""
    with tempfile.TemporaryDirectory(prefix="chatq-provider-limits-") as folder:
        out = os.path.join(folder, "result.json")
        command = [sys.executable, "-m", "bench.provider_limits", "--variants", variant, "--json", out]
        for name, value in options.items():
            if value is not None:
                command += [f"--{name.replace('_', '-')}", str(value)]
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return dict(json.load(f)[0])


def run(quick: bool = False) -> list[Block]:
    """The benchmark framework's entry (`python -m bench provider_limits`): the token bucket, then the window."""
    turns, rpm = (200, 300.0) if quick else (600, 300.0)
    results = [run_apart(v, turns=turns, rpm=rpm) for v in VARIANTS]
    # Issue 34's provider: 120 requests in a fixed 60 s window, 360 turns (quick: a 20 s window, 120 turns).
    w_turns, window = (120, 20.0) if quick else (360, 60.0)
    results += [run_apart(v, turns=w_turns, rpm=120.0, window=window) for v in ("adaptive", "baseline")]
    return blocks(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--rpm", type=float, default=300.0)
    parser.add_argument("--latency", type=float, default=0.3, help="the stub's seconds before the first byte")
    parser.add_argument("--window", type=float, default=None, help="a fixed window of S seconds instead of a bucket")
    parser.add_argument("--time-limit", type=float, default=None, help="stop each variant after S seconds")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results = []
    for variant in variants:
        shape = f" in a fixed {args.window:g} s window" if args.window else ""
        log(f"provider_limits: {variant}, {args.turns} turns at {args.rpm:g} rpm{shape}")
        options = {
            "turns": args.turns,
            "rpm": args.rpm,
            "latency": args.latency,
            "window": args.window,
            "time_limit": args.time_limit,
        }
        result = run_apart(variant, **options) if len(variants) > 1 else run_variant(variant, **options)
        log(json.dumps(result))
        results.append(result)
    return report(blocks(results), results, args.json)


if __name__ == "__main__":
    sys.exit(main())
