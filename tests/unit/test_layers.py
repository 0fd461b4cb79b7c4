"""The packages are layers that point one way, and no module imports itself back through others.

chatq (settings, root errors) < models (tables, storage) < handlers (agents) < worker (runtime,
ops, producer, CLI, gateway; celeryconfig beside it), and inside worker/ its rooms point one way
too. Every import counts, also one inside a function (a lazy import still ties the modules
together); only `if TYPE_CHECKING:` blocks are left out, since they never run. ruff's banned-api
rule (the nested ruff.toml files) holds the same line at lint time; this test also sees the
cycles within a layer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"chatq": 0, "models": 1, "handlers": 2, "worker": 3, "celeryconfig": 3}


def _modules() -> dict[str, Path]:
    found = {"celeryconfig": ROOT / "celeryconfig.py"}
    for package in ("chatq", "models", "handlers", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for branch in node.orelse for n in _imports_in(branch))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def _targets(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
    if isinstance(node, ast.ImportFrom):
        assert node.level == 0, "chatq uses absolute imports only"
        base = node.module or ""
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = {t for node in _imports(tree) for t in _targets(node, modules)} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _layer(module: str) -> int:
    return LAYERS[module.split(".", maxsplit=1)[0]]


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def test_there_is_no_import_cycle() -> None:
    assert _cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_and_the_graph_sees_lazy_imports() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # worker.runtime.delivery.relay imports handlers only inside a function: the graph still has the edge.
    assert "handlers" in import_graph()["worker.runtime.delivery.relay"]


# worker/'s rooms (README, "Where things live"). The shared modules at its top import no room; the
# store (a turn's rows and transitions) imports no other room, the runtime and ops never reach up
# into the edges (the CLI, the gateway), and the edges stay apart.
# The runtime calls named hook points that ops implements, and never imports ops: worker.wiring joins them.
# The session side (producer, deletion, dispatch) never imports the runtime either. worker.app, worker.celery
# and worker.wiring are entry points that wire rooms, so no rule binds them.
WORKER_SHARED = {
    f"worker.{name}"
    for name in (
        "errors",
        "payload",
        "storable",
        "events",
        "event_scripts",
        "schema",
        "queries",
        "envfile",
        "history",
        "sessions",
        "schedule_times",
        "schedule_records",
        "waiting",
        "webhook_urls",
        "log_context",
        "markers",
        "unacked",
        "delays",
        "tenant_usage",
        "budgets",
        "budget_scripts",
        "tenant_queue",
    )
}
# The session side: what a producer (a web app that only submits) loads; never the runtime.
WORKER_SESSION_SIDE = {f"worker.{name}" for name in ("producer", "deletion", "dispatch", "approvals", "schedules")}
WORKER_ROOMS = ("store", "runtime", "ops", "cli", "gateway")
ROOM_MAY_NOT_IMPORT = {
    "shared": {"store", "runtime", "ops", "cli", "gateway", "session", "entry"},
    "session": {"runtime", "ops", "cli", "gateway"},
    "store": {"runtime", "ops", "cli", "gateway"},
    "runtime": {"ops", "cli", "gateway"},
    "ops": {"cli", "gateway"},
    "cli": {"gateway"},
    "gateway": {"cli"},
}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "worker":
        return None
    if len(parts) > 1 and parts[1] in WORKER_ROOMS:
        return parts[1]
    if module in WORKER_SESSION_SIDE:
        return "session"
    return "shared" if module in WORKER_SHARED else "entry"


def _crossings(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (room := _room(module)) in ROOM_MAY_NOT_IMPORT and _room(target) in ROOM_MAY_NOT_IMPORT[room]
    ]


def test_worker_rooms_point_one_way() -> None:
    assert _crossings(import_graph()) == []
    # Every top-level worker module is named here: a new one is placed in a room on purpose.
    top = {name for name in import_graph() if name.count(".") == 1 and _room(name) in {"shared", "session", "entry"}}
    assert top == WORKER_SHARED | WORKER_SESSION_SIDE | {"worker.app", "worker.celery", "worker.wiring"}


def test_the_runtime_may_not_import_ops_and_a_planted_import_is_caught() -> None:
    # The runner used to import worker.ops.logs for its log context; a lazy import counts as much.
    planted = ast.parse("def f():\n    from worker.ops.logs import LogHooks\n")
    modules = _modules()
    graph = import_graph()
    graph["worker.runtime.delivery.runner"] |= {t for node in _imports(planted) for t in _targets(node, modules)}
    assert _crossings(graph) == ["worker.runtime.delivery.runner -> worker.ops.logs"]
    # The edge that joins them may import both.
    assert {"worker.ops.metrics", "worker.runtime.observers.observers"} <= import_graph()["worker.wiring"]


def _private_imports(tree: ast.AST) -> Iterator[str]:
    """Imported modules of other libraries with a private part (`openai._base_client`)."""
    for node in _imports(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for name in names:
            if name.split(".")[0] not in LAYERS and any(part.startswith("_") for part in name.split(".")):
                yield name


def test_only_chatq_shortcuts_imports_other_libraries_private_modules() -> None:
    found = {
        f"{name} -> {target}"
        for name, path in _modules().items()
        for target in _private_imports(ast.parse(path.read_text(), filename=str(path)))
        if target != "__future__" and not name.startswith("chatq.shortcuts.")
    }
    assert found == set()
    shortcuts = _modules()["chatq.shortcuts.openai_client"]
    assert "openai._base_client" in set(_private_imports(ast.parse(shortcuts.read_text())))


# handlers/ gets its data handed in (handlers/store.py): no module of it, adapters included, talks to
# the database. handlers/ruff.toml bans the same imports at lint time, except in the adapter folders,
# which lift TID251 for their frameworks; this test holds them too.
DATABASE_MODULES = ("sqlalchemy", "models.db")


def _database_imports(tree: ast.AST) -> Iterator[str]:
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for name in names:
            if any(name == banned or name.startswith(f"{banned}.") for banned in DATABASE_MODULES):
                yield name


def test_handlers_import_neither_sqlalchemy_nor_models_db() -> None:
    found = sorted(
        f"{name} -> {target}"
        for name, path in _modules().items()
        if name.split(".")[0] == "handlers"
        for target in set(_database_imports(ast.parse(path.read_text(), filename=str(path))))
    )
    assert found == []
    # The check sees each form of import, lazy ones too.
    probe = "import sqlalchemy.orm\ndef f():\n    from models import db\n    from models.db import session_scope\n"
    assert set(_database_imports(ast.parse(probe))) == {"sqlalchemy.orm", "models.db", "models.db.session_scope"}


# Settings and connections come in at the edges and are handed down (issue 27): `get_settings()` is
# called by the modules below only, `current_runtime()` by the worker's entry points only, and the
# store and the runtime take the engine and the Redis client they use as arguments.
SETTINGS_EDGES = {
    "models/db.py",  # the process's default engine (`get_engine()`)
    "worker/events.py",  # the process's default Redis client (`get_redis()`)
    "models/migrations/env.py",  # alembic's entry
    "worker/runtime/delivery/process.py",  # the worker's runtime (`current_runtime()`)
    "worker/cli/commands.py",  # the CLI's entry
    "worker/gateway/server.py",  # `chatq serve`: the gateway's entry
    "worker/producer.py",  # the producer's public functions
    "handlers/handler_settings.py",  # `process_handler_settings()`: handlers/' entries without a worker
}
# (And celeryconfig.py, beside the packages: a Celery process's configuration, which hands the values
# its signal handlers and broker transport need down through the app's conf.)
# handlers/ gets its settings handed in (`HandlerSettings`, from the worker's runtime); the public
# entries that have no worker to hand them in read them once, through `process_handler_settings()`,
# and pass them down. These are those entries, and no other module of handlers/ calls it.
HANDLER_SETTINGS_ENTRIES = {
    "handlers/__init__.py",  # `load_plugins()` without a list: the framework registry's readers
    "handlers/prepared.py",  # `PreparedTurnHandler.prepare`: `invoke`/`stream`/`astream` called directly
    "handlers/history.py",  # `trim_history` without a budget: a plain handler's call
    "handlers/tools.py",  # `run_tool` with no tool settings: a tool run outside a turn
    "handlers/accounting.py",  # `record_tool_call` with no prices and no tool context: outside a turn
}
RUNTIME_EDGES = {
    "worker/runtime/intake/tasks.py",  # the Celery task bodies
    "worker/runtime/intake/deadletter.py",  # the broker transport's refusals (Celery's consumer)
    "worker/runtime/recovery/sweep_timer.py",  # the worker_ready signal that starts the sweeps
    "worker/runtime/recovery/due_timer.py",  # the worker_ready signal that starts the due steps
}
# Where the runtime's connections are used, never fetched: no get_engine()/get_redis() and no scope
# without the engine it runs on (the lease keeper renews on the engine it was built with).
CONNECTION_TAKERS = ("worker/store/", "worker/runtime/", "worker/events.py", "worker/markers.py", "worker/dispatch.py")
CONNECTION_EDGES = {"worker/runtime/delivery/process.py", "worker/events.py"}
SCOPES = {"session_scope", "connection_scope", "autocommit_scope"}


def _called(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            yield name, node


def _callers(*names: str, bare_only: bool = False) -> set[str]:
    found = set()
    for package in ("chatq", "models", "handlers", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            for name, node in _called(ast.parse(path.read_text(), filename=str(path))):
                if name in names and not (bare_only and (node.args or node.keywords)):
                    found.add(str(path.relative_to(ROOT)))
    return found


def test_only_the_edges_read_the_settings() -> None:
    callers = _callers("get_settings")
    assert callers - SETTINGS_EDGES == set(), "read settings at an edge and hand them down"
    assert SETTINGS_EDGES - callers == set(), "a module stopped reading settings: drop it"
    # Fewer than ten modules in all, celeryconfig.py included (issue 27); one of them in handlers/.
    assert len(callers) + 1 < 10
    assert {path for path in callers if path.startswith("handlers/")} == {"handlers/handler_settings.py"}


def test_handlers_read_the_process_settings_only_at_their_entries_without_a_worker() -> None:
    assert _callers("process_handler_settings") == HANDLER_SETTINGS_ENTRIES
    # The worker's path hands them in: neither the turn's input nor an adapter reads them.
    assert not {path for path in HANDLER_SETTINGS_ENTRIES if "turn_input" in path or path.count("/") > 1}


def test_only_the_entry_points_fetch_the_runtime() -> None:
    assert _callers("current_runtime") == RUNTIME_EDGES


def test_the_store_and_the_runtime_take_their_connections() -> None:
    fetched = _callers("get_engine", "get_redis", "get_sessionmaker") | _callers(*SCOPES, bare_only=True)
    assert {path for path in fetched if path.startswith(CONNECTION_TAKERS)} - CONNECTION_EDGES == set()
    # The check sees a scope called without its engine, and lets one with it pass.
    probe = ast.parse("with session_scope() as db: pass\nwith connection_scope(engine) as db: pass\n")
    bare = [name for name, node in _called(probe) if name in SCOPES and not (node.args or node.keywords)]
    assert bare == ["session_scope"]
