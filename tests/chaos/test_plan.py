"""The seeded schedule: a seed replays the same plan, and the plan holds what the tier promises."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.chaos.plan import (
    AFTER_COMPLETION,
    BEFORE_COMPLETION,
    KEYED,
    SOAK,
    TIER1,
    Tier,
    make_plan,
    seed_from_env,
)


def test_a_seed_replays_the_same_plan() -> None:
    first, again, other = make_plan(TIER1, 7), make_plan(TIER1, 7), make_plan(TIER1, 8)
    assert (first.sends, first.faults) == (again.sends, again.faults)
    assert (first.sends, first.faults) != (other.sends, other.faults)


@pytest.mark.parametrize("tier", [TIER1, SOAK], ids=["tier1", "soak"])
def test_the_plan_holds_the_tiers_mix(tier: Tier) -> None:
    plan = make_plan(tier, 12345)
    deliveries = Counter(key for _, key in plan.sends)
    keyed = [f.key for f in plan.faults if f.kind in KEYED]
    assert len(set(deliveries) | set(keyed)) == tier.keys
    assert sum(1 for n in deliveries.values() if n == tier.burst_size) >= tier.burst_keys
    assert max(deliveries.values()) <= tier.max_deliveries
    assert sum(1 for n in deliveries.values() if n > 1) == int(tier.keys * tier.multi_fraction)
    assert len(plan.sends) + len(keyed) >= tier.messages
    assert Counter(f.kind for f in plan.faults) == Counter(tier.faults)
    points = {f.point for f in plan.faults if f.kind == "child_kill"}
    assert points & set(BEFORE_COMPLETION) and points & set(AFTER_COMPLETION)
    assert not set(keyed) & set(deliveries), "a keyed fault's key is sent by the fault alone"
    assert all(0 < f.at < tier.send_seconds for f in plan.faults if f.kind not in ("child_kill", "stale_row"))


def test_chaos_seed_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_SEED", "42")
    assert seed_from_env() == 42
    monkeypatch.delenv("CHAOS_SEED")
    assert 1 <= seed_from_env() < 2**31
