PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help venv test lint pytest demo system-deps

help:
	@echo "make demo    run the example project's demo of every cause of duplicate execution"
	@echo "make test    lint, type-check and run the whole test suite (what CI runs)"

$(BIN)/activate: setup.cfg pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(BIN)/activate

venv: $(BIN)/activate

# Chromium, libfaketime and the MariaDB client library from Debian, when missing.
system-deps:
	@scripts/system_deps.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy django_idempotent_tasks tests
	$(BIN)/python -m django makemigrations --check --dry-run --settings tests.settings --pythonpath .

pytest: venv system-deps
	@scripts/check_services.sh
	rm -f .coverage .coverage.*
	COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml $(BIN)/coverage run -m pytest $(PYTEST_ARGS)
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report --fail-under=95

test: lint pytest

demo: venv
	@NEED_POSTGRES=0 scripts/check_services.sh
	$(BIN)/python example_project/manage.py migrate --verbosity 0
	$(BIN)/python example_project/manage.py demo

# The suite on the other backends (README, "Databases and brokers"); CI runs them after `make test`.
# Each uses its own database or vhost, named by the URLs below, so they never touch `make test`'s.
MARIADB_URL ?= mysql://root@localhost/idempotent_tests
SQLITE_URL ?= sqlite:////tmp/idempotent-tests.sqlite3
RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/idempotent-tests

.PHONY: test-backends test-mariadb test-sqlite test-rabbitmq
test-backends: test-mariadb test-sqlite test-rabbitmq

# Everything, chaos tier 1 included.
test-mariadb: venv
	@NEED_POSTGRES=0 scripts/check_services.sh
	DATABASE_URL=$(MARIADB_URL) $(BIN)/python -m pytest --create-db $(PYTEST_ARGS)

# Everything but the chaos suite and the two pause tests marked row_locks (see the README on SQLite).
test-sqlite: venv
	@NEED_POSTGRES=0 scripts/check_services.sh
	DATABASE_URL=$(SQLITE_URL) $(BIN)/python -m pytest --create-db -m "not chaos and not row_locks" $(PYTEST_ARGS)

# The real-worker tests with RabbitMQ as the broker (records on PostgreSQL), on classic queues and
# then on quorum queues (countdowns then use Celery's native delayed delivery); the test setup
# creates and deletes the vhost. The demo and the chaos suite read Redis queues: they stay on Redis.
RABBITMQ_PYTEST := $(BIN)/python -m pytest -m "workers and not chaos" --ignore=tests/test_demo.py
test-rabbitmq: venv
	@scripts/check_services.sh
	IDEMPOTENT_TESTS_BROKER_URL=$(RABBITMQ_URL) $(RABBITMQ_PYTEST) $(PYTEST_ARGS)
	IDEMPOTENT_TESTS_BROKER_URL=$(RABBITMQ_URL) IDEMPOTENT_TESTS_QUEUE_TYPE=quorum $(RABBITMQ_PYTEST) $(PYTEST_ARGS)

# Not part of `make test`: purges 1,000,000 expired rows in its own database while another
# process claims new keys, and prints rows/s and insert latencies. Takes a few minutes.
purge-timing: venv
	$(BIN)/python scripts/purge_timing.py

.PHONY: screenshots
screenshots: venv  ## refresh docs/images/admin-*.png from the browser test
	IDEMPOTENT_TESTS_SCREENSHOTS=docs/images $(BIN)/pytest tests/test_browser.py

.PHONY: chaos soak

# Tier 1 of the chaos suite alone (make test runs it too); CHAOS_SEED=N replays a run.
chaos: venv
	@scripts/check_services.sh
	$(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)

# Tier 2: 10,000 deliveries, with restarts of a private PostgreSQL cluster on port 5434.
soak: venv
	@NEED_POSTGRES=0 scripts/check_services.sh
	scripts/soak.sh $(PYTEST_ARGS)

# Benchmarks (not part of `make test`): the peers come from PyPI as the `bench` extra.
# BENCH_ARGS scales them, e.g. BENCH_ARGS="--tasks 3000 --runs 5"; see BENCHMARKS.md.
BENCH_ARGS ?=

.PHONY: bench
bench:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[bench]"
	@scripts/check_services.sh
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The support matrix (tox.ini): the Pythons come from pyenv, put first on PATH for tox to find.
PYENV_ROOT ?= $(or $(HOME),/root)/.pyenv
empty :=
space := $(empty) $(empty)
MATRIX_PATH := $(subst $(space),:,$(wildcard $(PYENV_ROOT)/versions/3.1[0-3].*/bin))
TOX := PATH="$(MATRIX_PATH):$$PATH" $(BIN)/tox
EDGE_LEGS := py310-django42-celery54,py313-django61-celery57
# CI runs the edge legs after `make test` on the middle versions, so they skip what only costs time
# there: the chaos suite, the explorer and the browser tests (all run in `make test` and in `make matrix`).
EDGE_PYTEST_ARGS ?= -m "not chaos and not explorer and not browser"
TOX_ARGS ?=

.PHONY: matrix matrix-edges dist dist-check

matrix: venv
	@scripts/check_services.sh
	$(TOX) $(TOX_ARGS)

matrix-edges: venv
	@scripts/check_services.sh
	$(TOX) -e $(EDGE_LEGS) $(TOX_ARGS) -- $(EDGE_PYTEST_ARGS)

# Packaging: an sdist and a wheel in dist/, then their checks (twine, contents, a clean install).
dist: venv
	rm -rf dist build
	$(BIN)/python -m build --outdir dist .

dist-check: dist
	$(BIN)/twine check --strict dist/*
	$(BIN)/python scripts/check_dist.py dist

# The crash-and-fault explorer (docs/reliability.md): every fault at every boundary of one delivery
# per task kind, on each database of EXPLORE_DATABASES. EXPLORE_CELL=<kind>:<boundary>:<fault> runs
# one cell again; EXPLORE_MATRIX=slice runs the slice that make test runs (EXPLORE_SEED=N replays it).
EXPLORE_DATABASES ?= $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/test) mysql://root@localhost/test
EXPLORE_MATRIX ?= full

.PHONY: explore
explore: venv
	@NEED_POSTGRES=0 scripts/check_services.sh
	set -e; for url in $(EXPLORE_DATABASES); do \
	  DATABASE_URL=$$url EXPLORE_MATRIX=$(EXPLORE_MATRIX) $(BIN)/python -m pytest tests/explorer -k every_boundary $(PYTEST_ARGS); \
	done
