"""The error conventions: one errors module per package, one root for the product (`chatq.errors.ChatqError`),
docstrings as messages."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

import pytest

import chatq.errors
import handlers.errors
import models.errors
import worker.errors

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("chatq", "worker", "models", "handlers")
ERROR_MODULES: dict[ModuleType, type[Exception]] = {
    chatq.errors: chatq.errors.ChatqError,
    # The worker's errors derive from the product's root directly (it re-exports the shared ones).
    worker.errors: chatq.errors.ChatqError,
    models.errors: models.errors.ModelsError,
    handlers.errors: handlers.errors.HandlerError,
}


def _error_classes(module: ModuleType) -> list[type[Exception]]:
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ == module.__name__
    ]


@pytest.mark.parametrize("module", list(ERROR_MODULES), ids=lambda m: m.__name__)
def test_every_error_derives_from_its_package_root_and_says_its_docstring(module: ModuleType) -> None:
    root = ERROR_MODULES[module]
    classes = _error_classes(module)
    assert classes
    assert root in classes or module is worker.errors
    for cls in classes:
        assert issubclass(cls, root), f"{cls.__name__} does not derive from {root.__name__}"
        doc = (cls.__doc__ or "").strip()
        assert doc and "\n" not in doc, f"{cls.__name__} needs a one-line docstring (its default message)"
        error = cls()
        assert str(error) == doc
        assert error.message == doc  # type: ignore[attr-defined]
        assert cls("a specific message").message == "a specific message"  # type: ignore[attr-defined]


def test_every_package_root_is_the_one_product_root() -> None:
    # The CLI and the gateway report a ChatqError in one line, whichever package raised it.
    assert all(issubclass(root, chatq.errors.ChatqError) for root in ERROR_MODULES.values())
    assert worker.errors.ChatqError is chatq.errors.ChatqError


def _exception_names() -> set[str]:
    names = {"Exception", "BaseException"}
    for module in ERROR_MODULES:
        names.update(cls.__name__ for cls in _error_classes(module))
    return names


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def test_exceptions_are_defined_only_in_errors_modules() -> None:
    known = _exception_names()
    misplaced = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "errors.py" or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = {_base_name(base) for base in node.bases}
                    if bases & known or any(b.endswith(("Error", "Exception")) for b in bases):
                        misplaced.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert misplaced == []
