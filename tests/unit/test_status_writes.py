"""Nothing outside the turn store (`worker/store/`) writes `turns.status`.

Every change of a turn's status is one of the store's transitions, so adding a status means one
enum value, one statement and the partial index. The check reads the source: SQL text (`UPDATE
turns ... SET status =`, `INSERT INTO turns (..., status, ...)`), SQLAlchemy statements on `Turn`
(`update(Turn).values(status=...)`, rows with a `status` key, `Turn(status=...)`) and ORM writes
(`turn.status = ...`). Fixtures in tests/ and bench/ seed rows as they need and are not read.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from tests.unit.test_layers import _modules

STORE = "worker.store"

_SQL_COMMENT = re.compile(r"--[^\n]*")
_UPDATE = re.compile(
    r"\bUPDATE\s+(?:ONLY\s+)?turns\b(?:\s+(?:AS\s+)?(?!SET\b)\w+)?\s+SET\b(?P<set>.*?)(?=\bFROM\b|\bWHERE\b|\bRETURNING\b|$)",
    re.IGNORECASE | re.DOTALL,
)
_SET_STATUS = re.compile(r"(?:^|,)\s*(?:\w+\.)?status\s*=", re.IGNORECASE)
_INSERT = re.compile(r"\bINSERT\s+INTO\s+turns\s*\((?P<columns>[^)]*)\)", re.IGNORECASE)


def _sql_writes_status(sql: str) -> bool:
    sql = " ".join(_SQL_COMMENT.sub(" ", sql).split())
    if any(_SET_STATUS.search(match["set"]) for match in _UPDATE.finditer(sql)):
        return True
    return any(re.search(r"\bstatus\b", match["columns"], re.IGNORECASE) for match in _INSERT.finditer(sql))


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute name in the expression."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def _is_status_key(key: ast.expr | None) -> bool:
    """`"status"` or `Turn.status` as a key of a dict of values."""
    if isinstance(key, ast.Constant):
        return key.value == "status"
    return isinstance(key, ast.Attribute) and key.attr == "status" and "Turn" in _names(key.value)


def _has_status_key(args: list[ast.expr]) -> bool:
    return any(_is_status_key(key) for arg in args for d in ast.walk(arg) if isinstance(d, ast.Dict) for key in d.keys)


def _on_turns(call: ast.Call) -> bool:
    """`update(...)`/`insert(...)` of the turns table, anywhere in a chained call's receivers."""
    node: ast.expr = call
    while isinstance(node, ast.Call | ast.Attribute):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in {"update", "insert"} and node.args and "Turn" in _names(node.args[0]):
                return True
            node = node.func
        else:
            node = node.value
    return False


def _call_writes_status(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    keywords = {keyword.arg for keyword in call.keywords}
    if name == "Turn":
        return "status" in keywords
    if name == "setattr" and len(call.args) > 1:
        key = call.args[1]
        return isinstance(key, ast.Constant) and key.value == "status" and "turn" in str(_names(call.args[0])).lower()
    if name == "values":
        return _on_turns(call) and ("status" in keywords or _has_status_key(call.args))
    if name in {"execute", "executemany"}:
        # Rows given beside the statement: `execute(insert(Turn), [{..., "status": ...}])`.
        first = call.args[0] if call.args else None
        return isinstance(first, ast.Call) and _on_turns(first) and _has_status_key(call.args[1:])
    return False


def _assignment_writes_status(node: ast.Assign | ast.AugAssign | ast.AnnAssign) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
        if isinstance(target, ast.Attribute) and target.attr == "status":
            # A turn row's status: the object is a turn, or the value a TurnStatus.
            owner = " ".join(_names(target.value)).lower()
            if "turn" in owner or (node.value is not None and "TurnStatus" in _names(node.value)):
                return True
    return False


def status_writes(tree: ast.AST) -> Iterator[int]:
    """Lines that write `turns.status`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = _sql_writes_status(node.value)
        elif isinstance(node, ast.JoinedStr):
            found = _sql_writes_status(" ".join(p.value if isinstance(p, ast.Constant) else "x" for p in node.values))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            found = _assignment_writes_status(node)
        elif isinstance(node, ast.Call):
            found = _call_writes_status(node)
        else:
            found = False
        if found:
            yield getattr(node, "lineno", 0)


def _writers() -> dict[str, list[int]]:
    found = {}
    for name, path in _modules().items():
        lines = sorted(set(status_writes(ast.parse(path.read_text(), filename=str(path)))))
        if lines:
            found[name] = lines
    return found


def test_only_the_store_writes_turn_status() -> None:
    writers = _writers()
    outside = {name: lines for name, lines in writers.items() if not name.startswith(f"{STORE}.")}
    assert outside == {}, "write turns.status only through a transition of worker/store/claims.py"
    # The scan sees the store's own writes: its statements and its SQLAlchemy ones.
    assert set(writers) == {f"{STORE}.claims", f"{STORE}.transition_sql"}


PLANTED = {
    "sql update": "X = text(\"UPDATE turns SET status = 'failed' WHERE id = :id\")",
    "sql update, aliased, second column": 'X = """UPDATE turns t\nSET error = \'e\',\n t.status = \'failed\'"""',
    "sql update in an f-string": 'X = f"UPDATE turns SET lease_token = NULL, status = {S} WHERE id = :id"',
    "sql insert": "X = \"INSERT INTO turns (id, session_id, position, status) VALUES (1, 2, 3, 'queued')\"",
    "core update": "db.execute(update(Turn).where(Turn.id == i).values(status=TurnStatus.FAILED))",
    "core update, dict": 'db.execute(update(Turn).values({"status": TurnStatus.FAILED}))',
    "core update, column key": "db.execute(update(Turn).values({Turn.status: TurnStatus.FAILED}))",
    "core insert, rows": 'db.execute(insert(cast(Table, Turn.__table__)), [{"id": i, "status": s}])',
    "orm assignment": "turn.status = TurnStatus.CANCELLED",
    "orm assignment, any name": "row.status = TurnStatus.CANCELLED",
    "orm new row": "db.add(Turn(id=i, session_id=s, position=0, status=TurnStatus.QUEUED))",
    "setattr": 'setattr(turn, "status", s)',
}
"""A violation of each form, as it could be planted outside the store."""

ALLOWED = {
    "another column": "db.execute(update(Turn).where(Turn.status == s).values(webhook_url=u))",
    "sql reading status": "X = \"UPDATE turns t SET enqueued_at = now() WHERE t.status = 'queued'\"",
    "sql status in an expression": "X = \"UPDATE turns SET error = CASE WHEN status = 'failed' THEN 'x' END\"",
    "another table": "X = \"UPDATE webhook_deliveries SET status = 'sent' WHERE id = :id\"",
    "another object": 'state.status = row["status"].value',
}
"""Reads and other tables' statuses, which the check lets through."""


def test_the_check_finds_each_planted_write_and_nothing_else() -> None:
    missed = [form for form, source in PLANTED.items() if not list(status_writes(ast.parse(source)))]
    assert missed == []
    flagged = [form for form, source in ALLOWED.items() if list(status_writes(ast.parse(source)))]
    assert flagged == []
