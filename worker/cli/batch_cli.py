"""`chatq batch FILE.jsonl [--out RESULTS.jsonl]`: run batch conversations with progress and a summary."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from worker.cli.session_cli import tenant_arg


def register(sub: Any) -> None:
    """Add the `batch` subcommand."""
    batch = sub.add_parser("batch", help="run batch conversations from a JSONL file")
    batch.add_argument("file", metavar="FILE.jsonl")
    batch.add_argument("--out", metavar="RESULTS.jsonl", help="write one result line per finished conversation")
    batch.add_argument("--skip-invalid", action="store_true", help="submit the valid lines even if some are invalid")
    batch.add_argument(
        "--batch-id",
        help="namespace of the batch's ids (default: from the file's path; a new id runs the file again)",
    )
    batch.add_argument(
        "--tenant",
        type=tenant_arg,
        help="the tenant that owns every conversation's session (a line's own \"tenant\" overrides it)",
    )
    batch.add_argument("--poll", type=float, default=0.5, help="seconds between progress checks (default 0.5)")
    batch.add_argument("--no-wait", action="store_true", help="submit and exit without following")
    batch.set_defaults(func=run)


def default_batch_id(path: Path) -> str:
    """A batch id from the file's absolute path, so re-running the same command resumes it."""
    import hashlib

    return "file-" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


def run(args: argparse.Namespace) -> int:
    from worker.cli import batch as b
    from worker.errors import ChatqError

    path = Path(args.file)
    if not path.is_file():
        raise ChatqError(f"batch file not found: {args.file}")
    with path.open(encoding="utf-8", errors="strict") as handle:
        try:
            conversations, errors = b.parse_batch(handle, args.settings, tenant=args.tenant)
        except UnicodeDecodeError as exc:
            raise ChatqError(f"{args.file} is not UTF-8 text ({exc.reason})") from None
    for error in errors:
        print(f"chatq: {args.file}: {error}", file=sys.stderr)
    if errors and not args.skip_invalid:
        print(
            f"chatq: error: {len(errors)} invalid line(s); nothing was submitted (use --skip-invalid to run the rest)",
            file=sys.stderr,
        )
        return 1
    if not conversations:
        raise ChatqError(f"{args.file} holds no conversation to run")
    batch_id = args.batch_id or default_batch_id(path)
    started = time.monotonic()
    submission = b.submit_batch(batch_id, conversations)
    print(
        f"batch {batch_id}: {submission.conversations} conversations, {submission.turns} turns "
        f"({submission.new_turns} new) submitted in {time.monotonic() - started:.1f}s",
        file=sys.stderr,
    )
    for comparison in (*submission.appended, *submission.changed):
        print(f"chatq: {args.file}: {comparison}", file=sys.stderr)
    if submission.changed:
        print(new_batch_hint(args, batch_id, len(submission.changed)), file=sys.stderr)
    skipped = {c.conversation.id for c in submission.changed}
    running = [c for c in conversations if c.id not in skipped]
    failed = 1 if submission.changed else 0
    if args.no_wait or not running:
        return failed
    out = Path(args.out) if args.out else None
    code = follow(batch_id, running, out=out, poll=args.poll, started=started, submission=submission)
    return code if code else failed


def new_batch_hint(args: argparse.Namespace, batch_id: str, changed: int) -> str:
    """What to do about conversations edited since the batch stored them."""
    command = f"chatq batch {shlex.quote(args.file)} --batch-id NEW-NAME"
    if args.out:
        command += " --out NEW-RESULTS.jsonl"
    return (
        f"chatq: error: {changed} conversation(s) changed since batch {batch_id} stored them and were not run "
        f"(the others run); to run the edited file as a new batch: {command}"
    )


def follow(
    batch_id: str, conversations: list[Any], *, out: Path | None, poll: float, started: float, submission: Any
) -> int:
    """Follow the batch to its end, writing results as conversations finish; 0 if every turn succeeded."""
    from worker.cli import batch as b

    states: dict[Any, b.TurnState] = {}
    turns_of: dict[str, list[Any]] = {}
    for conv in conversations:
        ids = [b.turn_uuid(batch_id, conv.id, i) for i in range(len(conv.turns))]
        turns_of[conv.id] = ids
        for index, tid in enumerate(ids):
            states[tid] = b.TurnState(conversation=conv.id, index=index)
    written = _already_written(out)
    out_handle = out.open("a", encoding="utf-8") if out else None
    bar = ProgressBar(total=len(states), stream=sys.stderr, already_done=submission.already_done)
    progress = b.Progress(total=len(states))
    pending = [c for c in conversations if (str(b.session_uuid(batch_id, c.id)), len(c.turns)) not in written]
    try:
        while True:
            progress = _refresh(b, batch_id, conversations, states)
            still = []
            for conv in pending:
                if all(states[t].status in ("succeeded", "failed", "cancelled") for t in turns_of[conv.id]):
                    if out_handle:
                        line = b.conversation_result(batch_id, conv, states)
                        out_handle.write(json.dumps(line, ensure_ascii=False) + "\n")
                        out_handle.flush()
                else:
                    still.append(conv)
            pending = still
            bar.update(progress, time.monotonic() - started, note=provider_note(time.time()))
            if progress.done >= progress.total and not pending:
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        bar.finish()
        print("\nchatq: interrupted; the turns go on running. Run the same command again to resume.", file=sys.stderr)
        return 130
    finally:
        if out_handle:
            out_handle.close()
    bar.finish()
    wall = time.monotonic() - started
    print(summary(b, conversations, turns_of, states, progress, wall, submission), file=sys.stderr)
    return 0 if progress.failed == 0 else 1


def _already_written(out: Path | None) -> set[tuple[str, int]]:
    """(session id, turn count) of the results already in the file (a resumed run does not write them again).

    By session id, which derives from the batch id, so another batch writing to the same file
    still gets its own lines; and by turn count, so a conversation with turns appended since gets
    a new line with all of them.
    """
    if out is None or not out.exists():
        return set()
    written = set()
    for line in out.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            written.add((str(record["session_id"]), len(record["turns"])))
        except (ValueError, KeyError, TypeError):
            continue
    return written


def _refresh(b: Any, batch_id: str, conversations: list[Any], states: dict[Any, Any]) -> Any:
    progress = b.Progress(total=len(states))
    seen = set()
    for tid, row in b.poll_turns(batch_id, conversations):
        state = states.get(tid)
        if state is None:
            continue
        seen.add(tid)
        state.status = row["status"].value
        state.prompt_tokens = row["prompt_tokens"]
        state.completion_tokens = row["completion_tokens"]
        state.latency_ms = b.latency_ms(row["started_at"], row["finished_at"])
        state.error = row["error"] if state.status != "succeeded" else None
    for tid, state in states.items():
        if tid not in seen:  # deleted by hand: waiting for it would never end
            state.status, state.error = "failed", "the turn is no longer in Postgres"
        if state.status in ("succeeded", "failed", "cancelled"):
            progress.done += 1
            if state.status == "succeeded":
                progress.succeeded += 1
                if state.latency_ms is not None:
                    progress.latencies_ms.append(state.latency_ms)
            else:
                progress.failed += 1
        progress.prompt_tokens += state.prompt_tokens
        progress.completion_tokens += state.completion_tokens
    return progress


_HELD = {
    "rate_limited": "429 rate limited",
    "overloaded": "overloaded",
    "unreachable": "unreachable",
    "timeout": "not answering",
    "rpm": "at its request rate",
    "tpm": "at its token rate",
    "concurrency": "all slots in use",
    "interactive": "interactive turns first",
}


def provider_note(now: float) -> str:
    """`  held back by the provider (...)` while the model service or its shared limits hold turns back."""
    try:
        from worker.events import get_redis
        from worker.runtime.policy.limits import held_back

        held = held_back(get_redis(), now)
    except Exception:  # the bar goes on without the note
        return ""
    if not held:
        return ""
    model, entry = max(held.items(), key=lambda item: float(item[1].get("until") or 0))
    reason = _HELD.get(str(entry.get("reason")), str(entry.get("reason")))
    until = time.strftime("%H:%M:%S", time.localtime(float(entry.get("until") or now)))
    return f"  held back by the provider ({model}: {reason}, until {until})"


class ProgressBar:
    """A live bar on a terminal; a plain line every few seconds otherwise (logs, CI)."""

    def __init__(
        self, *, total: int, stream: TextIO, already_done: int = 0, width: int = 28, plain_every: float = 5.0
    ) -> None:
        self.total = total
        self.already_done = already_done
        """Turns finished before this run: not counted in its rate."""
        self.stream = stream
        self.width = width
        self.tty = stream.isatty() and os.environ.get("TERM") != "dumb"
        self.plain_every = plain_every
        self._last_plain = 0.0
        self._drawn = False

    def update(self, progress: Any, elapsed: float, note: str = "") -> None:
        rate = max(0, progress.done - self.already_done) / elapsed if elapsed > 0 else 0.0
        eta = (progress.total - progress.done) / rate if rate > 0 else None
        text = (
            f"{progress.done}/{progress.total} turns  failed {progress.failed}  "
            f"tokens {_human(progress.prompt_tokens)} in / {_human(progress.completion_tokens)} out  "
            f"{rate:.1f} turns/s  ETA {_duration(eta)}{note}"
        )
        if self.tty:
            filled = int(self.width * progress.done / max(1, progress.total))
            self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {text}\x1b[K")
            self.stream.flush()
            self._drawn = True
        elif elapsed - self._last_plain >= self.plain_every or progress.done >= progress.total:
            self._last_plain = elapsed
            self.stream.write(f"progress: {text}\n")
            self.stream.flush()

    def finish(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def summary(
    b: Any,
    conversations: list[Any],
    turns_of: dict[str, list[Any]],
    states: dict[Any, Any],
    progress: Any,
    wall: float,
    submission: Any,
) -> str:
    """The end-of-batch table; a resumed run's throughput counts only the turns that finished in it."""
    conv_ok = sum(1 for c in conversations if all(states[t].status == "succeeded" for t in turns_of[c.id]))
    not_run = f", {len(submission.changed)} not run (changed)" if submission.changed else ""
    lat = progress.latencies_ms
    p50, p95 = _ms(b.percentile(lat, 0.5)), _ms(b.percentile(lat, 0.95))
    ran = max(0, progress.done - submission.already_done)
    rows = [
        ("conversations", f"{conv_ok} ok, {len(conversations) - conv_ok} failed{not_run}"),
        ("turns", f"{progress.succeeded} ok, {progress.failed} failed"),
        ("tokens", f"{progress.prompt_tokens} in, {progress.completion_tokens} out"),
        (
            "latency",
            f"p50 {p50}, p95 {p95}, max {_ms(max(lat) if lat else None)}",
        ),
        ("wall time", f"{wall:.1f}s"),
    ]
    if submission.resumed:
        rows.append(("resumed", f"{submission.new_turns} submitted, {submission.already_done} already done"))
    if ran and wall > 0:
        rows.append(("throughput", f"{ran / wall:.2f} turns/s ({ran} turns finished in this run)"))
    else:
        rows.append(("throughput", "- (no turn finished in this run)"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value} ms"


def _human(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
