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
    harness.run_and_check(make_plan(SOAK, seed_from_env()), "soak", worker_env, capsys, postgres)
