# chatq: `make run` and `make test` do all the set-up themselves on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Sourced by recipes so that they use the Postgres and Redis scripts/services.sh settled on (the
# exported URLs, else the ones this clone recorded, else the defaults), never a default of make's.
WITH_ENV := set -a; . .local/services.env; set +a;
# Each test's name as it starts and its outcome as it ends, and the slowest at the end: a long
# suite on a busy machine never sits silent (PYTEST_PROGRESS= for pytest's dots).
PYTEST_PROGRESS ?= -v --durations=15

.PHONY: install services migrate run worker beat lint format test test-unit test-fast test-integration test-faults bench bench-peer clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

services: install
	PY=$(PY) scripts/services.sh

migrate: services
	$(WITH_ENV) $(VENV)/bin/chatq db upgrade

# The main job: a worker on the embedded defaults (the offline echo model unless OPENAI_API_KEY is set).
# It first says which Postgres and Redis it uses and whether chatq in another terminal here reaches
# them (every chatq process reads .env, then .local/services.env: chatq/envfile.py). Ctrl-C stops the worker cleanly (exit 0);
# make itself then ends as any interrupted program does, without an error line.
run: migrate
	@$(WITH_ENV) $(PY) -c 'import os; from worker.envfile import services_notice; print(services_notice(os.environ))'
	$(WITH_ENV) exec $(VENV)/bin/chatq worker --loglevel INFO

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The whole suite takes minutes (tens of them on a busy machine); `make test-fast` is the check to
# run after every change, `make test-unit` the quickest.
# On TEST_PROCESSES pytest processes (pytest-xdist; tests/conftest.py keeps a package's tests in one
# of them), each with its own database and Redis db; then, alone, the few tests that restart the
# Postgres or Redis all of them share (marked exclusive). Three on two cores: most of the suite's
# time is spent waiting on worker processes, Postgres and Redis, so a third process keeps the cores
# busy (make test 6 min 16 s with two, 5 min 13 s with three on the 2-core machine, 2026-12-04).
TEST_PROCESSES ?= 3
PARALLEL := -n $(TEST_PROCESSES)

test: services lint
	scripts/browser.sh
	@echo "make test: the whole suite, each test named as it runs; for a quick check: make test-fast"
	$(WITH_ENV) $(PY) -m pytest $(PYTEST_PROGRESS) $(PARALLEL) -m "not exclusive"
	$(WITH_ENV) $(PY) -m pytest $(PYTEST_PROGRESS) -m exclusive

test-unit: services
	$(WITH_ENV) $(PY) -m pytest $(PYTEST_PROGRESS) tests/unit

# Unit tests and the integration tests that run turns in-process (tests/support/inprocess.py) against
# the real Postgres and Redis: everything but the tests marked slow (real workers, other processes,
# faults; tests/support/workers.py refuses to start a worker for a test not marked slow).
test-fast: services
	$(WITH_ENV) $(PY) -m pytest $(PYTEST_PROGRESS) $(PARALLEL) -m "not slow" tests/unit tests/integration

test-integration: services
	$(WITH_ENV) $(PY) -m pytest $(PYTEST_PROGRESS) tests/integration

test-faults: services
	$(WITH_ENV) $(PY) -m pytest $(PYTEST_PROGRESS) tests/faults

bench: services
	$(WITH_ENV) $(PY) -m bench

# chatq beside LangGraph's own server (bench/peer.py), installed from pyproject's `peer` extra into
# a venv of its own so it never touches chatq's dependencies.
PEER_VENV ?= .local/peer-venv
bench-peer: services
	test -x $(PEER_VENV)/bin/langgraph || { python3 -m venv $(PEER_VENV) && $(PEER_VENV)/bin/python -m pip install -q --disable-pip-version-check -e '.[peer]'; }
	$(WITH_ENV) $(PY) -m bench peer

# Stops this clone's private Postgres and Redis (if it started any) and deletes their data first.
clean:
	test ! -d .local || scripts/services.sh remove
	rm -rf $(VENV) .local .pytest_cache .mypy_cache .ruff_cache *.egg-info
