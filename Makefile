PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

# The edit-test loop: no worker processes, browser, demo or chaos suite.
QUICK_MARKERS := not workers and not browser and not chaos

.PHONY: help venv test quick unit test-server-binding test-side-by-side lint pytest demo system-deps

help:  ## list the targets
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z_-]+:[^#]*## / {printf "make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/activate: setup.cfg pyproject.toml requirements/test.txt requirements/dev.txt | system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[metrics,opentelemetry]" -r requirements/dev.txt
	touch $(BIN)/activate

venv: $(BIN)/activate  ## create .venv with the package and the dev tools (every target does it)

system-deps:  ## install the Debian packages the targets need (as root), or print the command
	@scripts/system_deps.sh

lint: venv  ## ruff, ruff format --check, mypy --strict, migrations in sync
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy django_idempotent_tasks tests benchmarks
	$(BIN)/python -m django makemigrations --check --dry-run --settings tests.settings --pythonpath .

# What only runs on MySQL/MariaDB or SQLite (the key collation, the database clock's SQL, the
# connection probe, the changelist's count past its estimate threshold) is measured where it runs:
# the tests that reach it run again on those two.
VENDOR_COVERAGE_TESTS := tests/test_exact_keys.py tests/test_lifecycle.py \
	tests/test_admin_scale.py::test_a_filter_matching_more_than_the_threshold_shows_the_planners_estimate
# The replication check's MySQL branch (W011), the purge's OR bounds (MariaDB's), and SQLite's busy
# write lock at the completion.
MARIADB_COVERAGE_TESTS := tests/test_replication_check.py \
	tests/test_admin_scale.py::test_a_purge_across_ties_and_microseconds_deletes_batch_by_batch_each_record_once \
	-k "not real_asynchronous_standby"
SQLITE_COVERAGE_TESTS := tests/test_guarantee.py::test_6_sqlite_busy_at_the_completion_waits_and_completes

pytest: venv system-deps  ## the whole suite, then the vendor-specific tests on MariaDB and SQLite: branch coverage >= 98 %
	@scripts/check_services.sh
	rm -f .coverage .coverage.*
	COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml $(BIN)/coverage run -m pytest $(PYTEST_ARGS)
	DATABASE_URL=$(MARIADB_URL) $(BIN)/coverage run -m pytest -q --create-db $(VENDOR_COVERAGE_TESTS) $(MARIADB_COVERAGE_TESTS)
	DATABASE_URL=$(SQLITE_URL) $(BIN)/coverage run -m pytest -q --create-db $(VENDOR_COVERAGE_TESTS) $(SQLITE_COVERAGE_TESTS)
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report --fail-under=98

test: lint pytest  ## lint, then the whole suite (what CI runs)

quick: venv  ## the fast loop: unit and database tests, no workers, browser, demo or chaos
	@scripts/check_services.sh
	$(BIN)/python -m pytest -q -m "$(QUICK_MARKERS)" $(PYTEST_ARGS)

# Dead addresses: a test that reaches a service fails here instead of passing on a running one.
UNIT_ENV := IDEMPOTENT_TESTS_REDIS_URL=redis://127.0.0.1:1 DATABASE_URL=postgres://nobody@127.0.0.1:1/none
unit: venv  ## the tests that need no database, Redis or broker (-m unit, set by tests/conftest.py)
	$(UNIT_ENV) $(BIN)/python -m pytest -q -m unit $(PYTEST_ARGS)

# psycopg 3 binding the parameters on the server (Django's "server_side_binding" option), as a
# project away from PgBouncer may choose: make quick's selection with it on (CI runs it).
test-server-binding: venv  ## make quick's selection with psycopg's server-side binding (server_side_binding)
	@scripts/check_services.sh
	IDEMPOTENT_TESTS_SERVER_SIDE_BINDING=1 $(BIN)/python -m pytest -q --create-db -m "$(QUICK_MARKERS)" $(PYTEST_ARGS)

# Two runs at once, from this checkout and from a copy of its working tree: both must pass (the
# README's "Test runs share a machine"). PYTEST_ARGS replaces make quick's selection.
test-side-by-side: venv  ## make quick's selection twice at once, here and in a copy of this checkout
	@scripts/check_services.sh
	scripts/side_by_side.sh $(PYTEST_ARGS)

# The demo's own database: SQLite next to manage.py, whatever DATABASE_URL the tests use.
DEMO_DATABASE_URL ?= sqlite:///$(CURDIR)/example_project/db.sqlite3

demo: venv  ## the example project's demo of every cause of duplicate execution
	@NEED_POSTGRES=0 NEED_REDIS=url scripts/check_services.sh
	DATABASE_URL=$(DEMO_DATABASE_URL) $(BIN)/python example_project/manage.py migrate --verbosity 0
	DATABASE_URL=$(DEMO_DATABASE_URL) $(BIN)/python example_project/manage.py demo

# The suite on the other backends (README, "Databases and brokers"); CI runs them after `make test`.
# Each run names its test database and vhost after the URLs below and the run id (tests/isolation.py).
MARIADB_URL ?= mysql://root@localhost/idempotent_tests
SQLITE_URL ?= sqlite:////tmp/idempotent-tests.sqlite3
RABBITMQ_VHOST ?= idempotent-tests
RABBITMQ_URL ?= amqp://guest:guest@127.0.0.1:5672/$(RABBITMQ_VHOST)

.PHONY: test-backends test-mariadb test-sqlite test-rabbitmq
test-backends: test-mariadb test-sqlite test-rabbitmq  ## the suite on MariaDB and SQLite, the worker tests on RabbitMQ

# Everything, chaos tier 1 included; the explorer's slice runs on PostgreSQL (make explore: both).
test-mariadb: venv  ## the whole suite on MariaDB
	@NEED_POSTGRES=0 scripts/check_services.sh
	DATABASE_URL=$(MARIADB_URL) $(BIN)/python -m pytest --create-db -m "not explorer" $(PYTEST_ARGS)

# Everything but the chaos suite and the two pause tests marked row_locks (see the README on SQLite).
test-sqlite: venv  ## the suite on SQLite (no chaos, no row_locks tests)
	@NEED_POSTGRES=0 scripts/check_services.sh
	DATABASE_URL=$(SQLITE_URL) $(BIN)/python -m pytest --create-db -m "not chaos and not row_locks and not explorer" $(PYTEST_ARGS)

# The real-worker tests with RabbitMQ as the broker (records on PostgreSQL), on classic queues and
# then on quorum queues (countdowns then use Celery's native delayed delivery). Each pass runs in
# the vhost $(RABBITMQ_VHOST)-<run id>, which the test setup creates (deleting one an interrupted
# run left) and deletes. The demo and the chaos suite read Redis queues, and the Quickstart test
# runs the README's Redis setup: they stay on Redis.
# RABBITMQ_QUEUES=quorum runs one pass (CI: the queues RabbitMQ recommends for durable work).
RABBITMQ_PYTEST := $(BIN)/python -m pytest -m "workers and not chaos and not bench" --ignore=tests/test_demo.py --ignore=tests/test_quickstart.py
RABBITMQ_QUEUES ?= classic quorum
test-rabbitmq: venv  ## the real-worker tests with RabbitMQ as the broker (classic, then quorum queues)
	@scripts/check_services.sh
	@set -e; for queues in $(RABBITMQ_QUEUES); do \
	  echo "== RabbitMQ, $$queues queues"; \
	  IDEMPOTENT_TESTS_BROKER_URL=$(RABBITMQ_URL) IDEMPOTENT_TESTS_QUEUE_TYPE=$$queues $(RABBITMQ_PYTEST) $(PYTEST_ARGS); \
	done


.PHONY: bench-admin
bench-admin: venv  ## admin pages, commands and purge at 1,000,000 records on DATABASE_URL (any of the three)
	$(BIN)/python -m benchmarks.admin_timing $(if $(DATABASE_URL),--database-url $(DATABASE_URL)) $(BENCH_ARGS)

purge-timing: venv  ## purge 1,000,000 expired rows while another process claims keys (minutes)
	$(BIN)/python -m benchmarks.purge_timing

# The documentation site (docs/, Sphinx + MyST + Furo): warnings are errors, so a link to a missing
# page or heading fails the build; the Markdown files outside the site are checked offline by
# scripts/check_links.py. External links are checked only by docs-linkcheck, which needs the network.
DOCS_BUILD := docs/_build

.PHONY: docs docs-linkcheck
docs: venv  ## build the documentation site into docs/_build/html (warnings are errors), check the links offline
	$(BIN)/pip install --quiet -r requirements/docs.txt
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs $(DOCS_BUILD)/html
	$(BIN)/python scripts/check_links.py

docs-linkcheck: venv  ## check the external links of the documentation site (needs the network)
	$(BIN)/pip install --quiet -r requirements/docs.txt
	$(BIN)/sphinx-build -q -b linkcheck docs $(DOCS_BUILD)/linkcheck

.PHONY: screenshots
screenshots: venv  ## refresh docs/images/admin-*.png from the browser test
	IDEMPOTENT_TESTS_SCREENSHOTS=docs/images $(BIN)/pytest tests/test_browser.py tests/test_operator_browser.py

.PHONY: chaos soak test-topologies

chaos: venv  ## tier 1 of the chaos suite alone (make test runs it too); CHAOS_SEED=N replays a run
	@scripts/check_services.sh
	$(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)

# The production topologies (docs/deployment.md): PgBouncer, Redis Sentinel, a PostgreSQL primary
# with a synchronous or asynchronous standby, a partitioned worker; every process on loopback ports
# TOPOLOGIES_PORT_BASE .. +39, started and stopped by the tests. Not collected without -m topologies.
TOPOLOGIES_PORT_BASE ?= 6500
test-topologies: venv system-deps  ## the six production topologies under their faults (about 8 min)
	@scripts/check_services.sh
	TOPOLOGIES_PORT_BASE=$(TOPOLOGIES_PORT_BASE) $(BIN)/python -m pytest -m topologies tests/topologies $(PYTEST_ARGS)

soak: venv  ## tier 2: 10,000 deliveries with restarts of a private PostgreSQL on a free port
	@NEED_POSTGRES=0 scripts/check_services.sh
	scripts/soak.sh $(PYTEST_ARGS)

# Benchmarks (not part of `make test`): the peers come from PyPI through requirements/bench.txt.
# BENCH_ARGS scales them, e.g. BENCH_ARGS="--tasks 3000 --runs 5"; see BENCHMARKS.md.
BENCH_ARGS ?=

.PHONY: bench bench-mariadb
bench: venv  ## the benchmarks against the peers (see BENCHMARKS.md)
	$(BIN)/pip install --quiet -r requirements/bench.txt
	@NEED_REDIS=url scripts/check_services.sh
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# Section 1 alone on MariaDB (issue #17), in its own database, created here if missing.
MARIADB_BENCH_DATABASE ?= idempotent_bench
bench-mariadb: venv  ## section 1 of the benchmarks on MariaDB (see BENCHMARKS.md)
	$(BIN)/pip install --quiet -r requirements/bench.txt
	@NEED_POSTGRES=0 NEED_REDIS=url scripts/check_services.sh
	mariadb -uroot -e 'CREATE DATABASE IF NOT EXISTS `$(MARIADB_BENCH_DATABASE)`'
	DATABASE_URL=mysql://root@localhost/$(MARIADB_BENCH_DATABASE) $(BIN)/python -m benchmarks --sections overhead $(BENCH_ARGS)

# The support matrix (tox.ini): the Pythons come from pyenv, put first on PATH for tox to find.
PYENV_ROOT ?= $(or $(HOME),/root)/.pyenv
empty :=
space := $(empty) $(empty)
MATRIX_PATH := $(subst $(space),:,$(wildcard $(PYENV_ROOT)/versions/3.1[0-3].*/bin))
TOX := PATH="$(MATRIX_PATH):$$PATH" $(BIN)/tox
EDGE_LEGS := py310-django42-celery54,py313-django61-celery57
# CI runs the edge legs after `make test` on the middle versions, so they skip what only costs time
# there: the chaos suite, the explorer, the browser tests (all run in `make test` and in `make matrix`)
# and the benchmarks' interrupt test (`make test` only: its peers are in requirements/bench.txt).
EDGE_PYTEST_ARGS ?= -m "not chaos and not explorer and not browser and not bench"
TOX_ARGS ?=

.PHONY: matrix matrix-edges dist dist-check

matrix: venv  ## every leg of the support matrix (tox.ini)
	@scripts/check_services.sh
	$(TOX) $(TOX_ARGS)

# Both at once: each leg has its own redis-server and test database, and a leg mostly waits on its
# workers (two legs take about 8 min on 2 cores, one alone about as long).
matrix-edges: venv  ## the oldest and the newest leg of the matrix, side by side
	@scripts/check_services.sh
	$(TOX) -e $(EDGE_LEGS) --parallel 2 $(TOX_ARGS) -- $(EDGE_PYTEST_ARGS)

# Packaging: an sdist and a wheel in dist/, then their checks (twine, contents, a clean install).
dist: venv  ## build the sdist and the wheel into dist/
	rm -rf dist build
	$(BIN)/python -m build --outdir dist .

dist-check: dist  ## twine, the wheel's contents and metadata, a clean-venv install
	$(BIN)/twine check --strict dist/*
	$(BIN)/python scripts/check_dist.py dist

# The crash-and-fault explorer (docs/reliability.md): every fault at every boundary of one delivery
# per task kind, on each database of EXPLORE_DATABASES. EXPLORE_CELL=<kind>:<boundary>:<fault> runs
# one cell again; EXPLORE_MATRIX=slice runs the slice that make test runs (EXPLORE_SEED=N replays it).
EXPLORE_DATABASES ?= $(or $(DATABASE_URL),postgres://postgres@127.0.0.1:5432/test) mysql://root@localhost/test
EXPLORE_MATRIX ?= full

.PHONY: explore
explore: venv  ## the full crash-and-fault explorer on PostgreSQL and MariaDB (~25 min each)
	@NEED_POSTGRES=0 scripts/check_services.sh
	set -e; for url in $(EXPLORE_DATABASES); do \
	  DATABASE_URL=$$url EXPLORE_MATRIX=$(EXPLORE_MATRIX) $(BIN)/python -m pytest tests/explorer -k every_boundary $(PYTEST_ARGS); \
	done
