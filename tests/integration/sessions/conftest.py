"""Fixtures for the session tests: a real worker (started only by the tests that use it)."""

from __future__ import annotations

from tests.integration.worker.conftest import STUB_MODEL, worker, worker_env

__all__ = ["STUB_MODEL", "worker", "worker_env"]
