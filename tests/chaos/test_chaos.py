"""Tier 1 of the chaos suite: 2,000+ deliveries over 1,000 keys under every fault of the catalogue."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos import harness
from tests.chaos.plan import TIER1, make_plan, seed_from_env

pytestmark = [pytest.mark.workers, pytest.mark.chaos, pytest.mark.timeout(900)]


def test_tier1(worker_env: dict[str, str], transactional_db: Any, capsys: pytest.CaptureFixture[str]) -> None:
    plan = make_plan(TIER1, seed_from_env())
    with capsys.disabled():
        print(f"\nchaos tier 1: seed {plan.seed} (replay with CHAOS_SEED={plan.seed})", flush=True)
    outcome = harness.run(plan, worker_env, harness.lock_port(), postgres=None)
    with capsys.disabled():
        print(outcome.table(), flush=True)
    assert not outcome.verdict.violations, (
        f"{len(outcome.verdict.violations)} violations (seed {plan.seed}):\n"
        + "\n".join(outcome.verdict.violations[:50])
        + f"\n{outcome.table()}\nworker logs: {outcome.logs}"
    )
