"""Tenants sharing a rate-limited provider: each tenant's share while backlogged, interactive waits, the limit used.

`python -m bench.fairness [--a-turns 3000] [--bc-turns 300] [--rpm 600] [--variants tenants,baseline]`
(also `python -m bench fairness`; `--quick` there is 600 + 2 x 100 turns at 1200 rpm). The model service is
the test stub limited to `rpm` requests per minute (429 with `Retry-After` beyond), configured in
`CHATQ_MODEL_LIMITS` too; two `chatq worker` processes (8 threads each) run the turns.

Tenant `a` floods `a_turns` one-turn batch sessions; `delay` seconds later tenants `b` and `c` submit
`bc_turns` each; tenant `d` submits an interactive turn every `d_every` seconds until `b` and `c` are
done. Weights `a=1,b=1,c=2` (`CHATQ_TENANT_WEIGHTS`).

Variants, each on fresh services in the same run:

- `tenants`: the sessions carry their tenants, so the limit is shared by weight;
- `baseline`: the same turns on sessions without a tenant (one waiting line, first come first served:
  chatq before fair share);
- `budget` (its own shape): tenant `e` submits `--e-turns` (200) batch turns at once to the two workers
  under `CHATQ_TENANT_BUDGETS=e=<--budget>usd/day` (0.0005: about 50 of the stub's turns); the figure
  is what it spent beyond the budget in units of its largest turn's price (<= 1);
- `threads` and `threads_baseline` (their own shape): no model limit at all, the stub answering after
  `--latency` (0.25 s here), so the workers' 16 threads are the bottleneck. `a` floods `--a-turns`
  (1,500) batch turns, `b` and `c` submit `--bc-turns` (150) each `--delay` (5) seconds later, weights
  1:1:2; no `d`. Figures over the same window: `b`'s and `c`'s share against their weighted share,
  Jain's index, and the threads used (turns finished per second x the mean turn, `started` event to
  end, / 16). `threads_baseline` is the same run on sessions without a tenant (one FIFO, first come
  first served). `CHATQ_BENCH_FAIRNESS_SMOKE=1` shrinks every shape to a quick check that it runs.

Figures, over the window in which `a`, `b` and `c` all have turns waiting (from `b`'s and `c`'s submit
to the first of them finishing): turns finished per tenant against its weighted share of all started
(`b` and `c` within 5%), Jain's index of the shares divided by the weights (>= 0.95), requests the stub
answered 200 per minute against the limit (>= 0.9), the share of requests refused (<= 2%), and `d`'s
p95 wait from submit to start against the median time of one of its model calls. Nothing asserts a
time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from bench.common import ROOT, Block, chatq_worker, isolated_services, log, report, run_warmup, use_stub
from bench.provider_limits import WARMUP_MODEL, LimitedStub

MODEL = "gpt-4o-mini"
WEIGHTS = {"a": 1.0, "b": 1.0, "c": 2.0}
VARIANTS = ("tenants", "baseline")
THREAD_VARIANTS = ("threads", "threads_baseline")
THREADS = 16
"""Two `chatq worker` processes of 8 threads."""
SHAPES: dict[str, dict[str, Any]] = {
    "rate": {"a_turns": 3000, "bc_turns": 300, "rpm": 600.0, "latency": 0.3, "delay": 10.0, "d_every": 1.0},
    "threads": {"a_turns": 1500, "bc_turns": 150, "latency": 0.25, "delay": 5.0},
}
"""Each kind of variant's default shape (the command line's options override it)."""
SMOKE = {"a_turns": 120, "bc_turns": 20, "delay": 1.0, "e_turns": 20}
"""`CHATQ_BENCH_FAIRNESS_SMOKE=1`: small enough to check in a minute that a variant runs."""


def run_variant(
    variant: str, *, a_turns: int, bc_turns: int, rpm: float, latency: float, delay: float, d_every: float
) -> dict[str, Any]:
    """One run on fresh services; returns its figures."""
    from worker.producer import create_session, submit_turn

    with isolated_services(f"fairness_{variant}") as services, LimitedStub(rpm=rpm, latency=latency) as stub:
        stub.start()
        use_stub(stub.base_url)
        env = {
            **services,
            "OPENAI_BASE_URL": stub.base_url,
            "CHATQ_PROVIDER_PATIENCE": "1800",
            "CHATQ_MODEL_LIMITS": json.dumps({MODEL: {"rpm": rpm}}),
            "CHATQ_TENANT_WEIGHTS": ",".join(f"{t}={w:g}" for t, w in WEIGHTS.items()),
        }
        workers = [chatq_worker(concurrency=8, env=env, name=f"fair{i}") for i in range(2)]
        tenant_of: dict[uuid.UUID, str] = {}

        def submit(tenants: str, count: int, queue: str) -> None:
            for i in range(count):
                for tenant in tenants:  # several tenants' turns interleaved: they arrive together
                    session = create_session(
                        framework="none", model=MODEL, tenant=tenant if variant == "tenants" else None
                    )
                    tenant_of[submit_turn(session, f"{tenant} turn {i}", queue=queue).turn_id] = tenant

        try:
            for worker in workers:
                worker.start()
            run_warmup(None, [WARMUP_MODEL], turns_each=6)
            time.sleep(2.0)
            stub.reset()
            started = time.time()
            submit("a", a_turns, "chatq.batch")
            log(f"fairness: a's {a_turns} turns submitted in {time.time() - started:.1f} s")
            time.sleep(delay)
            submit("bc", bc_turns, "chatq.batch")
            joined = time.time()  # b's and c's turns are all in: the window is measured from here
            deadline = time.monotonic() + (a_turns + 2 * bc_turns) * 60.0 / rpm * 2 + 120
            next_d = time.monotonic()
            while time.monotonic() < deadline:
                if not _all_finished([t for t, who in tenant_of.items() if who in ("b", "c")]):
                    if time.monotonic() >= next_d:
                        submit("d", 1, "chatq")
                        next_d += d_every
                elif _all_finished(list(tenant_of)):
                    break
                time.sleep(0.1)
            rows = _rows(list(tenant_of))
            waits = {r.id: _wait_for_start(r.id, r.created_at.timestamp()) for r in rows if tenant_of[r.id] == "d"}
            answers = [(at, status) for at, status in stub.answers() if at >= started]
        finally:
            for worker in workers:
                worker.stop()
    return _figures(
        variant,
        rows,
        tenant_of,
        answers,
        waits,
        first_submit=started,
        joined=joined,
        rpm=rpm,
        a_turns=a_turns,
        bc_turns=bc_turns,
    )


def run_threads(variant: str, *, a_turns: int, bc_turns: int, latency: float, delay: float) -> dict[str, Any]:
    """The workers' threads as the bottleneck (no model limit): one run on fresh services; its figures."""
    from worker.producer import create_session, submit_turn

    tenants = variant == "threads"
    with isolated_services(f"fairness_{variant}") as services, LimitedStub(rpm=0, latency=latency) as stub:
        stub.start()
        use_stub(stub.base_url)
        env = {
            **services,
            "OPENAI_BASE_URL": stub.base_url,
            "CHATQ_TENANT_WEIGHTS": ",".join(f"{t}={w:g}" for t, w in WEIGHTS.items()),
        }
        workers = [chatq_worker(concurrency=THREADS // 2, env=env, name=f"threads{i}") for i in range(2)]
        tenant_of: dict[uuid.UUID, str] = {}

        def submit(names: str, count: int) -> None:
            for i in range(count):
                for tenant in names:  # b's and c's turns interleaved: they arrive together
                    session = create_session(framework="none", model=MODEL, tenant=tenant if tenants else None)
                    tenant_of[submit_turn(session, f"{tenant} turn {i}", queue="chatq.batch").turn_id] = tenant

        try:
            for worker in workers:
                worker.start()
            run_warmup(None, [WARMUP_MODEL], turns_each=6)
            time.sleep(2.0)  # both workers registered their threads (every CHATQ_DUE_INTERVAL)
            started = time.time()
            submit("a", a_turns)
            log(f"fairness: a's {a_turns} turns submitted in {time.time() - started:.1f} s")
            time.sleep(delay)
            submit("bc", bc_turns)
            joined = time.time()
            deadline = time.monotonic() + (a_turns + 2 * bc_turns) * latency / THREADS * 3 + 120
            while time.monotonic() < deadline and not _all_finished(list(tenant_of)):
                time.sleep(0.2)
            rows = _rows(list(tenant_of))
            starts = {r.id: _wait_for_start(r.id, 0.0) for r in rows if r.finished_at is not None}
        finally:
            for worker in workers:
                worker.stop()
    return _thread_figures(variant, rows, tenant_of, starts, joined=joined, a_turns=a_turns, bc_turns=bc_turns)


def _thread_figures(
    variant: str,
    rows: list[Any],
    tenant_of: dict[uuid.UUID, str],
    starts: dict[uuid.UUID, float],
    *,
    joined: float,
    a_turns: int,
    bc_turns: int,
) -> dict[str, Any]:
    finished: dict[str, list[float]] = {tenant: [] for tenant in "abc"}
    for row in rows:
        if row.finished_at is not None:
            finished[tenant_of[row.id]].append(row.finished_at.timestamp())
    # The window in which a, b and c all have turns waiting: from b's and c's submit to the first
    # of the three finishing its last turn.
    end = min(max(finished[t], default=joined) for t in "abc")
    window = max(end - joined, 1e-9)
    got = {t: sum(1 for at in finished[t] if joined <= at < end) for t in "abc"}
    total = sum(got.values())
    expected = {t: total * WEIGHTS[t] / sum(WEIGHTS.values()) for t in got}
    normalised = [got[t] / WEIGHTS[t] for t in got]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(v * v for v in normalised)) if total else float("nan")
    # A turn's time on its thread: its `started` event (published once it may run) to its end.
    spans = [
        row.finished_at.timestamp() - starts[row.id]
        for row in rows
        if row.finished_at is not None and not math.isnan(starts.get(row.id, float("nan")))
    ]
    mean_turn = statistics.mean(spans) if spans else float("nan")
    return {
        "variant": variant,
        "turns": {"a": a_turns, "b": bc_turns, "c": bc_turns},
        "succeeded": sum(1 for row in rows if row.status.value == "succeeded"),
        "failed": sum(1 for row in rows if row.status.value == "failed"),
        "unfinished": sum(1 for row in rows if row.finished_at is None),
        "window": window,
        "finished_span_from_join": {
            t: [round(min(v) - joined, 2), round(max(v) - joined, 2)] for t, v in finished.items() if v
        },
        "finished_in_window": got,
        "share_vs_weighted": {t: got[t] / expected[t] if expected[t] else float("nan") for t in got},
        "jain": jain,
        "mean_turn": mean_turn,
        "threads_used": total / window * mean_turn / THREADS,
    }


def share_blocks(r: dict[str, Any], name: str, *, fair: bool, counted: str, of: str = "") -> list[Block]:
    """b's and c's shares against their weighted share, and the Jain index: the figures every
    variant with tenants reports (targets only where `fair`; the run's details on b's block)."""
    details = {k: v for k, v in r.items() if k != "variant"}
    out = [
        Block(
            name=f"{name}.share_{tenant}",
            target=f"{tenant}'s turns {counted} while backlogged >= 0.95 of its weighted share{of}",
            figure=r["share_vs_weighted"][tenant],
            baseline=1.0,
            unit="x share",
            limit=0.95 if fair else None,
            baseline_label="its weighted share",
            higher_is_better=True,
            details=details if tenant == "b" else {},
        )
        for tenant in ("b", "c")
    ]
    out.append(
        Block(
            name=f"{name}.jain",
            target="Jain index of the shares over the weights >= 0.95",
            figure=r["jain"],
            baseline=1.0,
            unit="index",
            limit=0.95 if fair else None,
            baseline_label="perfectly fair",
            higher_is_better=True,
        )
    )
    return out


def thread_blocks(r: dict[str, Any]) -> list[Block]:
    """A threads variant's figures against the issue's targets (the baseline's for comparison)."""
    name, fair = f"fairness.{r['variant']}", r["variant"] == "threads"
    out = share_blocks(r, name, fair=fair, counted="finished", of=" of the threads")
    out.append(
        Block(
            name=f"{name}.threads_used",
            target="threads busy while backlogged (finished per second x mean turn / threads) >= 0.9",
            figure=r["threads_used"],
            baseline=1.0,
            unit="x threads",
            limit=0.9,
            baseline_label="every thread",
            higher_is_better=True,
        )
    )
    return out


PRICES = {"models": {MODEL: {"prompt": 0.15, "completion": 0.6}}, "currency": "USD"}
"""Dollars per million tokens, for the budget variant."""


def run_budget(*, turns: int, budget_usd: float, rpm: float, latency: float) -> dict[str, Any]:
    """Tenant `e` submits `turns` batch turns at once under a USD budget on two workers (8 threads each)."""
    from models.db import session_scope
    from models.tables import Turn
    from worker.producer import create_session, submit_turn

    with isolated_services("fairness_budget") as services, LimitedStub(rpm=rpm, latency=latency) as stub:
        stub.start()
        use_stub(stub.base_url)
        env = {
            **services,
            "OPENAI_BASE_URL": stub.base_url,
            "CHATQ_MODEL_LIMITS": json.dumps({MODEL: {"rpm": rpm}}),
            "CHATQ_PRICES": json.dumps(PRICES),
            "CHATQ_TENANT_BUDGETS": f"e={budget_usd}usd/day",
        }
        workers = [chatq_worker(concurrency=8, env=env, name=f"budget{i}") for i in range(2)]
        try:
            for worker in workers:
                worker.start()
            run_warmup(None, [WARMUP_MODEL], turns_each=6)
            ids = [
                submit_turn(
                    create_session(framework="none", model=MODEL, tenant="e"), f"e turn {i}", queue="chatq.batch"
                ).turn_id
                for i in range(turns)
            ]
            deadline = time.monotonic() + turns * 60.0 / rpm * 2 + 120
            while time.monotonic() < deadline and not _all_finished(ids):
                time.sleep(0.2)
            with session_scope() as db:
                rows = (
                    db.query(Turn.status, Turn.error, Turn.prompt_tokens, Turn.completion_tokens)
                    .filter(Turn.id.in_(ids))
                    .all()
                )
                prices = [
                    (row.prompt_tokens * 0.15 + row.completion_tokens * 0.6) / 1e6
                    for row in rows
                    if row.prompt_tokens or row.completion_tokens
                ]
                refused = sum(1 for row in rows if row.status.value == "failed" and "budget" in (row.error or ""))
                unfinished = sum(1 for row in rows if row.status.value not in ("succeeded", "failed"))
        finally:
            for worker in workers:
                worker.stop()
    spent = sum(prices)
    return {
        "variant": "budget",
        "turns": turns,
        "budget_usd": budget_usd,
        "spent_usd": spent,
        "turns_charged": len(prices),
        "refused": refused,
        "unfinished": unfinished,
        "largest_turn_usd": max(prices, default=0.0),
        "overrun_in_turns": max(spent - budget_usd, 0.0) / max(max(prices, default=0.0), 1e-12),
    }


def _rows(ids: list[uuid.UUID]) -> list[Any]:
    from models.db import session_scope
    from models.tables import Turn

    with session_scope() as db:
        return list(
            db.query(Turn.id, Turn.status, Turn.created_at, Turn.started_at, Turn.finished_at)
            .filter(Turn.id.in_(ids))
            .all()
        )


def _wait_for_start(turn_id: uuid.UUID, submitted: float) -> float:
    """Seconds from a turn's submit to its `started` event (published once it has its slot)."""
    from worker.events import get_redis, turn_stream

    for _, fields in get_redis().xrange(turn_stream(turn_id)):
        event = json.loads(fields[b"event"])
        if event["type"] == "started":
            return float(event["ts"]) - submitted
    return float("nan")


def _all_finished(ids: list[uuid.UUID]) -> bool:
    from sqlalchemy import func, select

    from models.db import session_scope
    from models.tables import Turn, TurnStatus

    if not ids:
        return False
    with session_scope() as db:
        done = db.execute(
            select(func.count())
            .select_from(Turn)
            .where(Turn.id.in_(ids), Turn.status.in_([TurnStatus.SUCCEEDED, TurnStatus.FAILED]))
        ).scalar_one()
    return int(done) >= len(ids)


def _figures(
    variant: str,
    rows: list[Any],
    tenant_of: dict[uuid.UUID, str],
    answers: list[tuple[float, int]],
    waits: dict[uuid.UUID, float],
    *,
    first_submit: float,
    joined: float,
    rpm: float,
    a_turns: int,
    bc_turns: int,
) -> dict[str, Any]:
    # A turn's started_at is its first claim; one that waited for a slot was claimed before it got
    # one, so the shares count turns by when they finished (a slot, then one model call).
    started: dict[str, list[float]] = {tenant: [] for tenant in "abcd"}
    for row in rows:
        if row.finished_at is not None:
            started[tenant_of[row.id]].append(row.finished_at.timestamp())
    d_waits = list(waits.values())
    d_calls = [
        row.finished_at.timestamp() - row.created_at.timestamp() - waits[row.id]
        for row in rows
        if row.id in waits and row.finished_at is not None
    ]
    # The contention window: b and c have turns waiting, and so does a (it has far more).
    ends = [max(started[t], default=joined) for t in ("b", "c")]
    end = min(*ends, max(started["a"], default=joined))
    window = max(end - joined, 1e-9)
    got = {t: sum(1 for at in started[t] if joined <= at < end) for t in ("a", "b", "c")}
    total = sum(got.values())
    weight_sum = sum(WEIGHTS.values())
    expected = {t: total * WEIGHTS[t] / weight_sum for t in got}
    normalised = [got[t] / WEIGHTS[t] for t in got]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(v * v for v in normalised)) if total else float("nan")
    in_window = [status for at, status in answers if joined <= at < end]
    ok = sum(1 for status in in_window if status == 200)
    d_sorted = sorted(w for w in d_waits if not math.isnan(w))
    spans = {t: [round(min(v) - joined, 2), round(max(v) - joined, 2)] for t, v in started.items() if v}
    return {
        "variant": variant,
        "turns": {"a": a_turns, "b": bc_turns, "c": bc_turns, "d": len(started["d"])},
        "succeeded": sum(1 for row in rows if row.status.value == "succeeded"),
        "failed": sum(1 for row in rows if row.status.value == "failed"),
        "window": window,
        "started_span_from_join": spans,
        "started_in_window": got,
        "share_vs_weighted": {t: got[t] / expected[t] if expected[t] else float("nan") for t in got},
        "jain": jain,
        "limit_used": ok / window * 60 / rpm,
        # The whole batch, first submit to last finish: a sparse line after the others are done shows here.
        "overall_used": _overall(rows, tenant_of, first_submit) * 60 / rpm,
        "refused_share": sum(1 for _, s in answers if s != 200) / max(len(answers), 1),
        "d_p95_wait": d_sorted[math.ceil(0.95 * len(d_sorted)) - 1] if d_sorted else float("nan"),
        "d_call": statistics.median(d_calls) if d_calls else float("nan"),
    }


def _overall(rows: list[Any], tenant_of: dict[uuid.UUID, str], first_submit: float) -> float:
    """Batch turns finished per second from a's first submit to the last batch finish."""
    ends = [row.finished_at.timestamp() for row in rows if tenant_of[row.id] != "d" and row.finished_at]
    return len(ends) / (max(ends) - first_submit) if ends else 0.0


def blocks(results: list[dict[str, Any]]) -> list[Block]:
    """Each variant's figures against the issue's targets; the baseline's for comparison."""
    out: list[Block] = []
    for r in results:
        if r["variant"] in THREAD_VARIANTS:
            out.extend(thread_blocks(r))
            continue
        if r["variant"] == "budget":
            out.append(
                Block(
                    name="fairness.budget.overrun",
                    target="spend beyond the budget <= one turn's price",
                    figure=r["overrun_in_turns"],
                    baseline=1.0,
                    unit="turns",
                    limit=1.0,
                    baseline_label="the largest turn's price",
                    details={k: v for k, v in r.items() if k != "variant"},
                )
            )
            continue
        name = f"fairness.{r['variant']}"
        out.extend(share_blocks(r, name, fair=r["variant"] == "tenants", counted="started"))
        out.append(
            Block(
                name=f"{name}.limit_used",
                target="requests answered per minute while backlogged >= 0.9 of the limit",
                figure=r["limit_used"],
                baseline=1.0,
                unit="x limit",
                limit=0.9,
                baseline_label="the provider's limit",
                higher_is_better=True,
            )
        )
        out.append(
            Block(
                name=f"{name}.overall_used",
                target="the whole batch, first submit to last finish, against the limit",
                figure=r["overall_used"],
                baseline=1.0,
                unit="x limit",
                limit=None,
                baseline_label="the provider's limit",
                higher_is_better=True,
            )
        )
        out.append(
            Block(
                name=f"{name}.refused",
                target="429 share <= 2%",
                figure=r["refused_share"],
                baseline=1.0,
                unit="share",
                limit=0.02,
                baseline_label="all requests",
            )
        )
        out.append(
            Block(
                name=f"{name}.interactive_p95_wait",
                target="d's p95 wait for its start <= one model call",
                figure=r["d_p95_wait"],
                baseline=r["d_call"],
                unit="s",
                limit=1.0,
                baseline_label="median d turn, start to finish",
            )
        )
    return out


def run_apart(variant: str, **options: Any) -> dict[str, Any]:
    """`run_variant` in a Python process of its own (the Celery app keeps the first variant's broker)."""
    with tempfile.TemporaryDirectory(prefix="chatq-fairness-") as folder:
        out = os.path.join(folder, "result.json")
        command = [sys.executable, "-m", "bench.fairness", "--variants", variant, "--json", out]
        if variant == "budget":  # its own shape: one tenant under a budget
            options = {key: value for key, value in options.items() if key in ("rpm", "latency", "e_turns")}
        elif variant in THREAD_VARIANTS:  # no limit: no rpm, no interactive d
            options = {key: value for key, value in options.items() if key not in ("rpm", "d_every", "e_turns")}
        for name, value in options.items():
            command += [f"--{name.replace('_', '-')}", str(value)]
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return dict(json.load(f)[0])


def run(quick: bool = False) -> list[Block]:
    """The benchmark framework's entry (`python -m bench fairness`)."""
    shape = {"a_turns": 600, "bc_turns": 100, "rpm": 1200.0} if quick else {}
    results = [run_apart(variant, **shape) for variant in (*VARIANTS, "budget")]
    threads = {"a_turns": 600, "bc_turns": 60} if quick else {}
    return blocks(results + [run_apart(variant, **threads) for variant in THREAD_VARIANTS])


def main(argv: list[str] | None = None) -> int:
    everything = (*VARIANTS, "budget", *THREAD_VARIANTS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-turns", type=int, default=None, help="a's turns (3000; threads variants 1500)")
    parser.add_argument("--bc-turns", type=int, default=None, help="b's and c's each (300; threads variants 150)")
    parser.add_argument("--rpm", type=float, default=None, help="the model's limit (600)")
    parser.add_argument(
        "--latency", type=float, default=None, help="the stub's seconds before the first byte (0.3; 0.25)"
    )
    parser.add_argument("--delay", type=float, default=None, help="seconds between a's flood and b's and c's (10; 5)")
    parser.add_argument("--d-every", type=float, default=None, help="seconds between d's interactive turns (1)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(everything)}")
    parser.add_argument("--e-turns", type=int, default=200, help="the budget variant's turns")
    parser.add_argument("--budget", type=float, default=0.0005, help="the budget variant's USD a day")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    smoke = SMOKE if os.environ.get("CHATQ_BENCH_FAIRNESS_SMOKE") == "1" else {}
    given = {
        "a_turns": args.a_turns,
        "bc_turns": args.bc_turns,
        "rpm": args.rpm,
        "latency": args.latency,
        "delay": args.delay,
        "d_every": args.d_every,
    }
    e_turns = int(smoke.get("e_turns", args.e_turns))
    results = []
    for variant in variants:
        kind = "threads" if variant in THREAD_VARIANTS else "rate"
        shape = {**SHAPES[kind], **{k: v for k, v in smoke.items() if k in SHAPES[kind]}}
        options = {**shape, **{k: v for k, v in given.items() if v is not None and k in shape}}
        if variant == "budget":
            log(f"fairness: budget, e {e_turns} under ${args.budget:g} at {options['rpm']:g} rpm")
            budget_shape = {"rpm": options["rpm"], "latency": options["latency"]}
            result = (
                run_apart(variant, **budget_shape, e_turns=e_turns)
                if len(variants) > 1
                else run_budget(turns=e_turns, budget_usd=args.budget, **budget_shape)
            )
        elif kind == "threads":
            log(f"fairness: {variant}, a {options['a_turns']} + b, c {options['bc_turns']} each, no model limit")
            result = run_apart(variant, **options) if len(variants) > 1 else run_threads(variant, **options)
        else:
            shape_text = f"a {options['a_turns']} + b, c {options['bc_turns']} each"
            log(f"fairness: {variant}, {shape_text} at {options['rpm']:g} rpm")
            result = run_apart(variant, **options) if len(variants) > 1 else run_variant(variant, **options)
        log(json.dumps(result))
        results.append(result)
    return report(blocks(results), results, args.json)


if __name__ == "__main__":
    sys.exit(main())
