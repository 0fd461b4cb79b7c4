"""`chatq submit|watch|show|cancel|usage`: a turn from the command line, from its submission to its usage.

    chatq submit SESSION TEXT [--turn-id ID] [--image PATH]... [--reply-to MSG] [--if-busy ...]
                 [--webhook URL] [--at ISO8601 | --in DURATION] [--tenant T] [--follow] [--json]
    chatq watch [SESSION] [--turn TURN] [--json]
    chatq show TURN [--json]
    chatq cancel TURN
    chatq usage [--session S] [--batch BATCH_ID] [--tenant TENANT] [--json]

These are producer commands: they import no agent framework, so `chatq submit` returns its turn id
quickly. Errors are one line on stderr and exit code 1 (`worker.cli.commands.main`); a bad option
value (`--at`, `--in`, `--tenant`) is a usage error, exit 2. Only the standard library, `worker.errors`
and `worker.cli.session_cli` (standard library only) are imported at module level.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import logging
import mimetypes
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.cli.session_cli import tenant_arg
from worker.errors import CliError

if TYPE_CHECKING:
    from worker.tenant_usage import TenantSpend

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
"""`main`'s exit codes (`worker.cli.commands`): 0 when the command did what it was asked, 1 when not."""


def register(sub: Any) -> None:
    """Add `submit`, `watch`, `show`, `cancel` and `usage`."""
    submit = sub.add_parser("submit", help="enqueue a turn and print its id")
    submit.add_argument("session", metavar="SESSION")
    submit.add_argument("text", metavar="TEXT")
    submit.add_argument("--turn-id", help="use this turn id (idempotent: the same id is accepted once)")
    submit.add_argument("--image", action="append", metavar="PATH", help="attach an image file or URL (repeatable)")
    submit.add_argument("--reply-to", type=int, metavar="MSG", help="answer this earlier user message (regenerate)")
    submit.add_argument("--if-busy", default="enqueue", choices=["enqueue", "reject", "interrupt"])
    submit.add_argument("--webhook", metavar="URL", help="POST this turn here when it ends, instead of the session's")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--at", type=_at, metavar="ISO8601", help="run from this time (with its offset, e.g. ...+00:00)")
    when.add_argument("--in", dest="delay", type=_in, metavar="DURATION", help="run after 90, 90s, 5m, 2h or 1d")
    submit.add_argument(
        "--tenant", type=tenant_arg, help="the session must be this tenant's (else an error and nothing is stored)"
    )
    submit.add_argument("--follow", action="store_true", help="stream the reply; exit 0 on success, 1 on failure")
    submit.add_argument("--json", action="store_true", help="print JSON (with --follow: one event per line)")
    submit.set_defaults(func=cmd_submit)

    watch = sub.add_parser("watch", help="print live events of a session, or replay one turn")
    watch.add_argument("session", nargs="?", metavar="SESSION")
    watch.add_argument("--turn", metavar="TURN", help="replay this turn from its first event to its end")
    watch.add_argument("--json", action="store_true", help="one JSON event per line")
    watch.set_defaults(func=cmd_watch)

    show = sub.add_parser("show", help="show a turn and its messages")
    show.add_argument("turn", metavar="TURN")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)

    cancel = sub.add_parser("cancel", help="cancel a queued or running turn")
    cancel.add_argument("turn", metavar="TURN")
    cancel.set_defaults(func=cmd_cancel)

    usage = sub.add_parser("usage", help="token usage totals")
    usage.add_argument("--session", metavar="S")
    usage.add_argument("--batch", metavar="BATCH_ID", help="only the sessions of this batch")
    usage.add_argument("--tenant", metavar="TENANT", help="only the sessions of this tenant")
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(func=cmd_usage)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _at(value: str) -> Any:
    """--at: an ISO 8601 time with its offset (a usage error otherwise)."""
    from worker.delays import parse_at
    from worker.errors import InvalidTurn

    try:
        return parse_at(value)
    except InvalidTurn as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _in(value: str) -> float:
    """--in: a duration, `90`, `90s`, `5m`, `2h` or `1d` (a usage error otherwise)."""
    from worker.delays import parse_in
    from worker.errors import InvalidTurn

    try:
        return parse_in(value)
    except InvalidTurn as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _image_ref(value: str) -> str:
    """An --image argument: a URL as is, or a local file turned into a data: URL."""
    if value.startswith(("http://", "https://", "data:image/")):
        return value
    path = Path(value)
    if not path.is_file():
        raise CliError(f"image file not found: {value}")
    mime = mimetypes.guess_type(path.name)[0] or ""
    if not mime.startswith("image/"):
        raise CliError(f"not an image file (by its extension): {value}")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def cmd_submit(args: argparse.Namespace) -> int:
    from worker.producer import submit_turn

    images = [_image_ref(value) for value in args.image] if args.image else None
    turn = submit_turn(
        args.session,
        args.text,
        images=images,
        reply_to=args.reply_to,
        turn_id=args.turn_id,
        if_busy=args.if_busy,
        webhook=args.webhook,
        run_at=args.at,
        delay=args.delay,
        tenant=args.tenant,
    )
    if not args.follow:
        if args.json:
            _print_json(
                {
                    "turn_id": str(turn.turn_id),
                    "session_id": str(turn.session_id),
                    "position": turn.position,
                    "created": turn.created,
                    "run_at": turn.run_at.isoformat() if turn.run_at else None,
                }
            )
        else:
            print(turn.turn_id)
        return EXIT_OK
    try:
        if not args.json:
            print(turn.turn_id, file=sys.stderr)
        return _follow(turn.turn_id, json_lines=args.json)
    except KeyboardInterrupt:
        # Ctrl-C stops the following, not the turn: say how to pick it up again (or stop it).
        print(
            f"\nchatq: stopped following; turn {turn.turn_id} goes on. "
            f"Re-attach: chatq watch --turn {turn.turn_id}  (stop it: chatq cancel {turn.turn_id})",
            file=sys.stderr,
        )
        raise


def _follow(turn_id: uuid.UUID, *, json_lines: bool) -> int:
    """Print a turn's events to its end; 0 if it succeeded, 1 otherwise."""
    from worker.cli.follow import EventPrinter, follow_turn
    from worker.queries import turn_report

    printer = EventPrinter(json_lines=json_lines)
    last: dict[str, Any] | None = None

    def finished() -> bool:
        return str(turn_report(turn_id)["status"]) in ("succeeded", "failed", "cancelled")

    for event in follow_turn(turn_id, finished=finished):
        printer(event)
        last = event
    if last is None or last.get("type") not in ("final", "error", "cancelled"):
        # The replay stream is gone (older than its retention, or Redis lost it) or has no terminal
        # event yet: Postgres knows. The printer adds only what did not stream.
        report = turn_report(turn_id)
        printer.stored(report)
        return EXIT_OK if report["status"] == "succeeded" else EXIT_FAILED
    return EXIT_OK if last.get("type") == "final" else EXIT_FAILED


def cmd_watch(args: argparse.Namespace) -> int:
    from worker.cli.follow import EventPrinter, require_session, require_turn, watch_session
    from worker.payload import parse_uuid

    if args.turn:
        turn_id = parse_uuid(args.turn, "turn")
        require_turn(turn_id)
        return _follow(turn_id, json_lines=args.json)
    if not args.session:
        raise CliError("give a SESSION to watch, or --turn TURN")
    session_id = parse_uuid(args.session, "session")
    require_session(session_id)
    printer = EventPrinter(json_lines=args.json)
    for event in watch_session(session_id):
        printer(event)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from worker.queries import turn_report

    report = turn_report(args.turn)
    if args.json:
        _print_json(report)
        return EXIT_OK
    usage = report["usage"]
    position = "no position until due" if report["position"] is None else f"position {report['position']}"
    print(f"turn     {report['id']}  (session {report['session_id']}, {position})")
    if report["tenant"]:
        print(f"tenant   {report['tenant']}")
    print(f"status   {report['status']}  after {report['attempts']} attempt(s)")
    if report.get("run_at"):
        print(f"run at   {report['run_at']}")
    if report["error"]:
        print(f"error    {report['error']}")
    print(
        f"usage    {usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion"
        f" = {usage['total_tokens']} tokens"
    )
    if report.get("webhook"):
        print(f"webhook  {_webhook_line(report['webhook'])}")
    if report.get("steps"):
        print(f"steps    {_steps_line(report['steps'])}")
    for message in report["messages"]:
        label = message["role"]
        if message["tool_calls"]:
            calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('args'))})" for c in message["tool_calls"])
            print(f"[{label}] calls {calls}")
        if message["content"] or not message["tool_calls"]:
            print(f"[{label}] {message['content']}")
    if report.get("pending_input"):
        print(f"[user, when due] {report['pending_input'].get('content')}")
    return EXIT_OK


def _steps_line(steps: list[dict[str, Any]]) -> str:
    """`chatq show`'s steps line: the finished steps of the turn's journal and the attempt of each."""
    done = [step for step in steps if step["kind"] != "tool_started"]
    by_attempt: dict[int, int] = {}
    for step in done:
        by_attempt[step["attempt"]] = by_attempt.get(step["attempt"], 0) + 1
    attempts = ", ".join(f"{count} by attempt {attempt}" for attempt, count in sorted(by_attempt.items()))
    unfinished = len({s["call_id"] for s in steps if s["kind"] == "tool_started"} - {s["call_id"] for s in done})
    line = f"{len(done)} done ({attempts})" if done else "none done"
    return line + (f", {unfinished} tool call(s) started without a result" if unfinished else "")


def _webhook_line(webhook: dict[str, Any]) -> str:
    """`chatq show`'s webhook line: where, and how its delivery went."""
    if webhook["status"] is None:
        return f"{webhook['url']}  (sent when the turn ends)"
    last = f"HTTP {webhook['last_status_code']}" if webhook["last_status_code"] is not None else "no answer"
    line = f"{webhook['url']}  {webhook['status']} after {webhook['attempts']} attempt(s), last {last}"
    if not webhook["attempts"]:  # refused before any POST (the address rule)
        line = f"{webhook['url']}  {webhook['status']}, no POST made"
    if webhook["last_error"] and webhook["status"] != "delivered":
        line += f": {webhook['last_error']}"
    return f"{line}  (delivery {webhook['delivery_id']})"


def cmd_cancel(args: argparse.Namespace) -> int:
    from worker.producer import cancel_turn

    done = cancel_turn(args.turn)
    if done.already:
        cancelled = done.status.value == "cancelled"
        print(f"turn {args.turn} {'was already cancelled' if cancelled else 'is already stopping (cancel requested)'}")
    elif done.status.value == "cancelled":
        print(f"turn {args.turn} cancelled")
    else:
        print(f"turn {args.turn} is running; asked it to stop")
    return EXIT_OK


def _with_slots(rows: list[TenantSpend]) -> list[TenantSpend]:
    """The rows with the slots each tenant received under the models' limits (Redis; best effort)."""
    from chatq.tenant_weights import NO_TENANT
    from worker.events import get_redis
    from worker.runtime.policy.limits import slots_by_tenant

    try:
        slots = slots_by_tenant(get_redis())
    except Exception as exc:  # the report stands on Postgres; the slots are extra
        log.debug("slots per tenant unavailable: %s", exc)
        return rows
    return [dataclasses.replace(row, slots=slots.get(row.tenant or NO_TENANT, 0)) for row in rows]


def cmd_usage(args: argparse.Namespace) -> int:
    from worker.budgets import budget_report, format_budgets
    from worker.queries import format_usage, usage_report
    from worker.tenant_usage import format_tenant_spend, spend_by_tenant

    report = usage_report(args.session, batch=args.batch, prices=args.settings.prices, tenant=args.tenant)
    overall = args.session is None and args.batch is None and args.tenant is None
    # Overall, each tenant's spend too; shown only once some session belongs to a tenant.
    tenants = spend_by_tenant(args.settings.prices) if overall else []
    if not any(row.tenant is not None for row in tenants):
        tenants = []
    elif tenants:
        tenants = _with_slots(tenants)
    # Spend against CHATQ_TENANT_BUDGETS this period: overall every budgeted tenant, or the one asked for.
    budgets = budget_report(args.settings, tenant=args.tenant) if overall or args.tenant is not None else []
    if args.json:
        extra = {"by_tenant": [row.as_dict() for row in tenants]} if overall else {}
        if budgets:
            extra["budgets"] = [row.as_dict() for row in budgets]
        _print_json({**report, **extra})
        return EXIT_OK
    for line in format_usage(report):
        print(line)
    if tenants:
        print()
        for line in format_tenant_spend(tenants, report.get("currency") or ""):
            print(line)
    if budgets:
        print()
        for line in format_budgets(budgets):
            print(line)
    return EXIT_OK
