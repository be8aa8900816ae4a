"""Tier 1 of the chaos suite: 2,000+ deliveries over 1,000 keys under every fault of the catalogue."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos import harness
from tests.chaos.plan import TIER1, make_plan, seed_from_env

pytestmark = [pytest.mark.workers, pytest.mark.chaos, pytest.mark.timeout(900)]


def test_tier1(worker_env: dict[str, str], transactional_db: Any, capsys: pytest.CaptureFixture[str]) -> None:
    harness.run_and_check(make_plan(TIER1, seed_from_env()), "tier 1", worker_env, capsys)
