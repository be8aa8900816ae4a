"""Tier 2 of the chaos suite, run by ``make soak`` (scripts/soak.sh starts its PostgreSQL)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.chaos import harness
from tests.chaos.plan import SOAK, make_plan, seed_from_env
from tests.chaos.services import PrivatePostgres

pytestmark = [pytest.mark.workers, pytest.mark.chaos, pytest.mark.timeout(3600)]


def test_soak(worker_env: dict[str, str], transactional_db: Any, capsys: pytest.CaptureFixture[str]) -> None:
    postgres = PrivatePostgres(os.environ["CHAOS_PG_DATA"], os.environ["CHAOS_PG_BIN"])
    plan = make_plan(SOAK, seed_from_env())
    with capsys.disabled():
        print(f"\nchaos soak: seed {plan.seed} (replay with CHAOS_SEED={plan.seed})", flush=True)
    outcome = harness.run(plan, worker_env, harness.lock_port(), postgres=postgres)
    with capsys.disabled():
        print(outcome.table(), flush=True)
    assert not outcome.verdict.violations, (
        f"{len(outcome.verdict.violations)} violations (seed {plan.seed}):\n"
        + "\n".join(outcome.verdict.violations[:50])
        + f"\n{outcome.table()}\nworker logs: {outcome.logs}"
    )
