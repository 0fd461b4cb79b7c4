"""The `chatq` command line (docs/contract.md, "Command line").

Errors are one clear line on stderr and a non-zero exit code, never a traceback. Producer
commands import no agent framework, so `chatq submit` returns its turn id quickly. Variables not
set in the environment are read from `.env` and `.local/services.env` (chatq/envfile.py).

This module is the CLI's edge: `main` reads the settings once and hands them to the subcommand
functions as `args.settings`; the modules behind it (the subcommands, migrations, schema check)
take what they need as arguments. It holds the parser, `main` and the commands that run or set up
a service (`db`, `worker`, `beat`, `flower`: the pass-through ones read the settings themselves);
the others come from the modules that `build_parser` asks to register theirs: `session create|list|...`
(`worker.cli.session_cli`), a turn's `submit`, `watch`, `show`, `cancel` and `usage`
(`worker.cli.turn_cli`), then `COMMAND_MODULES`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from worker.errors import ChatqError

if TYPE_CHECKING:
    from chatq.settings import Settings

COMMAND_MODULES: tuple[str, ...] = (
    "worker.cli.approval_cli",
    "worker.cli.batch_cli",
    "worker.gateway.command",
    "worker.cli.kb_cli",
    "worker.cli.schedule_cli",
    "worker.cli.session_cli",
)
"""Modules with a `register(subparsers)` function that add more `chatq` subcommands."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def cmd_db(args: argparse.Namespace) -> int:
    from models.migrate import upgrade

    settings: Settings = args.settings
    upgrade(settings.database_url, default_model=settings.default_model)
    print(f"database is up to date ({settings.database_url_masked})")
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


def cmd_flower(args: argparse.Namespace, extra: list[str]) -> int:
    from chatq.settings import get_settings
    from worker.ops.flower import cmd_flower as run

    get_settings()  # a bad environment fails here, in one line, not inside Flower's Celery
    return run(args, extra)


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
    importlib.import_module("worker.cli.session_cli").register_actions(
        session_sub
    )  # create, list, show, update, delete
    importlib.import_module("worker.cli.turn_cli").register(sub)  # submit, watch, show, cancel, usage

    for module in COMMAND_MODULES:
        # Each adds its subcommands; they import only the standard library at module level.
        importlib.import_module(module).register(sub)
    return parser


PASSTHROUGH: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "worker": cmd_worker,
    "beat": cmd_beat,
    "flower": cmd_flower,
}


def _explain(exc: BaseException) -> str:
    """One line for an error, with any password masked."""
    from chatq.masking import mask_secrets

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
