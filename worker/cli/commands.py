"""The `chatq` command line (docs/contract.md, "Command line").

Errors are one clear line on stderr and a non-zero exit code, never a traceback. Producer
commands import no agent framework, so `chatq submit` returns its turn id quickly. Variables not
set in the environment are read from `.env` and `.local/services.env` (chatq/envfile.py).

This module is the CLI's edge: `main` reads the settings once and hands them to the subcommand
functions as `args.settings`; the modules behind it (the subcommands, migrations, schema check)
take what they need as arguments.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import mimetypes
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from worker.errors import ChatqError, CliError

if TYPE_CHECKING:
    from chatq.settings import Settings

COMMAND_MODULES: tuple[str, ...] = (
    "worker.cli.approval_cli",
    "worker.cli.batch_cli",
    "worker.gateway.command",
    "worker.cli.kb_cli",
    "worker.cli.session_cli",
)
"""Modules with a `register(subparsers)` function that add more `chatq` subcommands."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


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


def cmd_db(args: argparse.Namespace) -> int:
    from models.migrate import upgrade

    settings: Settings = args.settings
    upgrade(settings.database_url, default_model=settings.default_model)
    print(f"database is up to date ({settings.database_url_masked})")
    return EXIT_OK


def cmd_session_create(args: argparse.Namespace) -> int:
    from worker.cli.approval_cli import approval_value
    from worker.cli.session_cli import metadata_pairs, warn_model
    from worker.producer import create_session

    session_id = create_session(
        framework=args.framework,
        model=args.model,
        system_prompt=args.system_prompt,
        metadata=metadata_pairs(args.metadata),
        knowledge_bases=args.kb,
        webhook=args.webhook,
        approval=None if args.approval is None else approval_value(args.approval),
    )
    # Only a warning: the worker, not this terminal, runs the turns and may well have the key.
    warn_model(args.model, args.settings)
    if args.json:
        _print_json({"session_id": str(session_id)})
    else:
        print(session_id)
    return EXIT_OK


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
    )
    if not args.follow:
        if args.json:
            _print_json(
                {
                    "turn_id": str(turn.turn_id),
                    "session_id": str(turn.session_id),
                    "position": turn.position,
                    "created": turn.created,
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
    print(f"turn     {report['id']}  (session {report['session_id']}, position {report['position']})")
    print(f"status   {report['status']}  after {report['attempts']} attempt(s)")
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


def cmd_usage(args: argparse.Namespace) -> int:
    from worker.queries import format_usage, usage_report

    report = usage_report(args.session, batch=args.batch, prices=args.settings.prices)
    if args.json:
        _print_json(report)
        return EXIT_OK
    for line in format_usage(report):
        print(line)
    return EXIT_OK


def _celery_command(arguments: list[str]) -> list[str]:
    from chatq.settings import get_settings

    get_settings()  # a bad environment fails here, in one line, not inside Celery
    return [sys.executable, "-m", "celery", "-A", "worker.app:app", *arguments]


def _exec_celery(arguments: list[str]) -> NoReturn:
    """Replace this process with Celery (signals then reach Celery directly, for graceful shutdown)."""
    command = _celery_command(arguments)
    sys.stdout.flush()
    os.execv(sys.executable, command)


def cmd_worker(args: argparse.Namespace, extra: list[str]) -> int:
    from chatq.settings import get_settings
    from handlers import load_plugins
    from worker.cli.node_names import hold_for_exec
    from worker.cli.service import run_service
    from worker.cli.supervisor import default_processes, take_processes
    from worker.schema import require_schema

    processes, extra = take_processes(extra)
    settings = get_settings()
    asks_help = bool({"-h", "--help"} & set(extra))
    if not asks_help:
        require_schema(settings)  # an unmigrated database: say `chatq db upgrade` now, not in every turn's error
        # A plugin that cannot be imported fails every Celery process at start (a restart loop of
        # tracebacks under the supervisor): one line and exit 1 here instead.
        load_plugins(settings.plugins)
    defaults = [
        "worker",
        # Turns wait on the model, not the CPU: threads keep many in flight on few cores.
        "--pool",
        "threads",
        "--concurrency",
        str(settings.worker_concurrency),
        "--queues",
        # In this order (queue_order_strategy "priority"): chats, then batches, then webhooks.
        "chatq,chatq.batch,chatq.webhooks",
        "--task-events",
        "--loglevel",
        "INFO",
    ]
    count = processes if processes is not None else default_processes()
    if count == 1 or asks_help:
        if not asks_help:
            hold_for_exec(defaults + extra)  # a second worker under this node name: one line, exit 1
        _exec_celery(defaults + extra)
    # One interpreter per core (worker/cli/supervisor.py), each with a node name no other service
    # on this host uses, all serving their metrics on one endpoint.
    return run_service(defaults + extra, count, command=_celery_command, settings=settings)


def cmd_beat(args: argparse.Namespace, extra: list[str]) -> int:
    schedule = Path(tempfile.gettempdir()) / f"chatq-beat-{os.getuid()}"
    _exec_celery(["beat", "--schedule", str(schedule), "--loglevel", "INFO", *extra])


def one_line(text: str) -> str:
    """Escape anything that would break a line or the terminal (user input can hold both)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class Parser(argparse.ArgumentParser):
    """argparse with chatq's error style: one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"chatq: error: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="chatq", description="AI-agent chat turns as background jobs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = sub.add_parser("db", help="database schema")
    db.add_argument("action", choices=["upgrade"], help="create or migrate the schema")
    db.set_defaults(func=cmd_db)

    sub.add_parser(
        "worker",
        help="run a worker: one process per core (--processes N); other options go to `celery worker`",
        add_help=False,
    )
    sub.add_parser("beat", help="run the sweeper schedule (extra options go to `celery beat`)", add_help=False)
    sub.add_parser("flower", help="run Flower with authentication (extra options go to Flower)", add_help=False)

    session = sub.add_parser("session", help="chat sessions")
    session_sub = session.add_subparsers(dest="session_command", required=True, metavar="ACTION")
    create = session_sub.add_parser("create", help="create a session and print its id")
    create.add_argument(
        "--framework",
        default="langgraph",
        help="agent framework: langgraph (default), none, plain_openai or one a CHATQ_PLUGINS module registers",
    )
    create.add_argument(
        "--model", help="model name (default: the worker's default model, CHATQ_MODEL of the worker running a turn)"
    )
    create.add_argument("--system-prompt", help="the session's own instructions")
    create.add_argument(
        "--kb", action="append", default=[], metavar="KB", help="attach this knowledge base (repeatable)"
    )
    create.add_argument("--webhook", metavar="URL", help="POST each turn here when it ends (http or https)")
    create.add_argument(
        "--approval", metavar="POLICY", help="tool calls a person approves: none, paid, all or TOOL,TOOL,..."
    )
    create.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="store KEY with the string VALUE in its metadata (repeatable; `session list --metadata` filters on it)",
    )
    create.add_argument("--json", action="store_true", help="print JSON")
    create.set_defaults(func=cmd_session_create)
    importlib.import_module("worker.cli.session_cli").register_actions(session_sub)  # list, show, update, delete

    submit = sub.add_parser("submit", help="enqueue a turn and print its id")
    submit.add_argument("session", metavar="SESSION")
    submit.add_argument("text", metavar="TEXT")
    submit.add_argument("--turn-id", help="use this turn id (idempotent: the same id is accepted once)")
    submit.add_argument("--image", action="append", metavar="PATH", help="attach an image file or URL (repeatable)")
    submit.add_argument("--reply-to", type=int, metavar="MSG", help="answer this earlier user message (regenerate)")
    submit.add_argument("--if-busy", default="enqueue", choices=["enqueue", "reject", "interrupt"])
    submit.add_argument("--webhook", metavar="URL", help="POST this turn here when it ends, instead of the session's")
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
    usage.add_argument("--json", action="store_true")
    usage.set_defaults(func=cmd_usage)

    for module in COMMAND_MODULES:
        # Each adds its subcommands; they import only the standard library at module level.
        importlib.import_module(module).register(sub)
    return parser


def cmd_flower(args: argparse.Namespace, extra: list[str]) -> int:
    from chatq.settings import get_settings
    from worker.ops.flower import cmd_flower as run

    get_settings()  # a bad environment fails here, in one line, not inside Flower's Celery
    return run(args, extra)


PASSTHROUGH: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "worker": cmd_worker,
    "beat": cmd_beat,
    "flower": cmd_flower,
}


def _explain(exc: BaseException) -> str:
    """One line for an error, with any password masked."""
    from chatq.settings import mask_secrets

    if isinstance(exc, ChatqError):
        return mask_secrets(exc.message)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    module = type(exc).__module__
    if module.startswith(("sqlalchemy", "psycopg")):
        from chatq.settings import get_settings
        from worker.schema import is_undefined_table, schema_missing

        where = get_settings().database_url_masked
        if is_undefined_table(exc):
            return schema_missing(where).message
        return f"cannot use Postgres at {where}: {mask_secrets(text)}"
    if module.startswith(("redis", "kombu")):
        from chatq.settings import get_settings

        return f"cannot use Redis at {get_settings().redis_url_masked}: {mask_secrets(text)}"
    return mask_secrets(f"{type(exc).__name__}: {text}")


def main(argv: Sequence[str] | None = None) -> int:
    from chatq.envfile import resolved_environ

    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        # The settings would do it on first use; done first so that a bad file is one line before
        # any command starts, and what a pass-through command execs inherits the filled environment.
        resolved_environ()
    except ChatqError as exc:
        print(f"chatq: error: {one_line(exc.message)}", file=sys.stderr)
        return EXIT_FAILED
    if arguments and arguments[0] in PASSTHROUGH:
        try:
            return PASSTHROUGH[arguments[0]](argparse.Namespace(), arguments[1:])
        except ChatqError as exc:
            print(f"chatq: error: {one_line(_explain(exc))}", file=sys.stderr)
            return EXIT_FAILED
    args = build_parser().parse_args(arguments)
    try:
        from chatq.settings import get_settings

        args.settings = get_settings()  # read once, here; each subcommand takes them from `args`
        result: int = args.func(args)
        return result
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        print(f"chatq: error: {one_line(_explain(exc))}", file=sys.stderr)
        return EXIT_FAILED
