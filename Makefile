PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: help venv test lint pytest demo

help:
	@echo "make demo    run the example project's demo of every cause of duplicate execution"
	@echo "make test    lint, type-check and run the whole test suite (what CI runs)"

$(BIN)/activate: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(BIN)/activate

venv: $(BIN)/activate

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy django_idempotent_tasks tests
	$(BIN)/python -m django makemigrations --check --dry-run --settings tests.settings --pythonpath .

pytest: venv
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

# Benchmarks (not part of `make test`): the peers come from PyPI as the `bench` extra.
# BENCH_ARGS scales them, e.g. BENCH_ARGS="--tasks 3000 --runs 5"; see BENCHMARKS.md.
BENCH_ARGS ?=

.PHONY: bench
bench:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[bench]"
	@scripts/check_services.sh
	$(BIN)/python -m benchmarks $(BENCH_ARGS)
