"""Kill at every boundary: strike each I/O boundary of one delivery per task kind, one fault per run.

``make test`` runs a slice (every boundary once, its fault rotating by EXPLORE_SEED); ``make
explore`` the full matrix (EXPLORE_MATRIX=full); ``EXPLORE_CELL=<kind>:<boundary>:<fault> make
explore`` one cell again. The cells of holes fixed since run as regression cells.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from tests.chaos.harness import lock_port
from tests.explorer import cells, verdict
from tests.explorer.harness import Explorer, Run
from tests.explorer.tasks import KINDS

pytestmark = [pytest.mark.workers, pytest.mark.explorer, pytest.mark.timeout(3600)]

VENDOR = "postgresql" if "postgresql" in settings.DATABASES["default"]["ENGINE"] else "mysql"
# Cells that broke an invariant before the completion learned to survive a connection killed
# mid-body (non-atomic: the completion's UPDATE failed on it, the delivery was re-queued and the
# external call ran again at fence 2). Each runs on every database as a regression cell.
REGRESSIONS = [
    "external:sql:INSERT@store.insert#1:after:db_kill",
    "external:external:call#1:before:db_kill",
    "external:external:call#1:after:db_kill",
    "external:sql:UPDATE@store.complete#1:before:db_kill",
]


@pytest.fixture(scope="module")
def explorer(worker_env: dict[str, str], django_db_blocker: Any) -> Iterator[Explorer]:
    with django_db_blocker.unblock():
        running = Explorer(worker_env, lock_port()).start()
        try:
            yield running
        finally:
            running.stop()


def chosen(kind: str, explorer: Explorer, seed: int) -> list[cells.Cell]:
    boundaries = explorer.record(kind)
    mode = cells.mode()
    if mode == "cell":
        cell = cells.Cell.parse(os.environ["EXPLORE_CELL"])
        return [cell] if cell.kind == kind else []
    if mode == "full":
        return cells.full(kind, boundaries, explorer.vendor)
    return cells.rotating(kind, boundaries, explorer.vendor, seed, skip=set(REGRESSIONS))


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_boundary(
    kind: str, explorer: Explorer, transactional_db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = cells.seed()
    runs: dict[str, Run] = {}
    for cell in chosen(kind, explorer, seed):
        run = runs[cell.id] = explorer.run(cell)
        if cells.mode() != "slice":  # the full matrix takes long: show each cell as it ends
            with capsys.disabled():
                print(f"\n  {run.outcome:>9} {run.seconds:5.1f} s  {cell.id}", end="", flush=True)
    recordings = {kind: explorer.record(kind)}
    with capsys.disabled():
        print(f"\nexplorer {kind} on {VENDOR}, {cells.mode()}, seed {seed} (replay: EXPLORE_SEED={seed})")
        print(verdict.matrix(kind, recordings[kind], runs))
        print(verdict.totals(recordings, runs), flush=True)
    unexpected = [run for run in runs.values() if run.violations]
    assert not unexpected, verdict.totals(recordings, {run.cell.id: run for run in unexpected})


@pytest.mark.parametrize("cell", REGRESSIONS)
def test_regression_cell(cell: str, explorer: Explorer, transactional_db: Any) -> None:
    run = explorer.run(cells.Cell.parse(cell))
    assert run.struck, f"{cell}: the boundary was not reached"
    assert run.applied, f"{cell}: no database connection was open at the boundary"
    assert not run.violations, f"{cell}: {run.violations} [{run.notes}]"
