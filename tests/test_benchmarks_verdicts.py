"""The benchmarks' verdicts are honest: a system that loses units or runs them twice never meets a target."""

from __future__ import annotations

from benchmarks.verdicts import Outcome, noop_target, work_target


def ran(units: int, seconds: float, *, once: int | None = None, duplicates: int = 0) -> Outcome:
    """A run of ``units`` units whose effects exist ``once`` times (all of them unless told)."""
    once = units if once is None else once
    return Outcome(seconds, units, units, once, duplicates, units - once)


def test_a_body_that_never_runs_meets_no_target() -> None:
    # Failing every delivery at once is the fastest way through a queue: 840 units, none run.
    never = [ran(840, 1.0, once=0)] * 3
    naive = [ran(840, 8.0)] * 3
    plain = [ran(840, 4.0)] * 3

    work = work_target("IdempotentTask", never, "naive", naive)
    noop = noop_target("IdempotentTask", 4.0, never, "plain", plain)

    for target in (work, noop):
        assert target.verdict.startswith("not met")
        assert "IdempotentTask: 2520 units never ran" in target.verdict
    assert work.measured.startswith("0 vs 105 (0.00×)")


def test_duplicate_effects_fail_a_target_the_rate_reaches() -> None:
    twice = [ran(100, 0.5, duplicates=3)]
    target = work_target("IdempotentTask", twice, "naive", [ran(100, 1.0)])
    assert target.verdict == "not met (IdempotentTask: 3 duplicate effects)"


def test_a_baseline_that_lost_units_is_no_baseline() -> None:
    target = noop_target("IdempotentTask", 0.9, [ran(100, 1.0)], "plain", [ran(100, 1.0, once=90)])
    assert target.verdict == "not met (plain: 10 units never ran)"


def test_met_only_when_every_unit_ran_once_and_the_figure_is_reached() -> None:
    assert work_target("IdempotentTask", [ran(100, 1.0)], "naive", [ran(100, 1.1)]).verdict == "met"
    assert noop_target("IdempotentTask", 0.6, [ran(100, 1.0)], "plain", [ran(100, 0.6)]).verdict == "met"
    slow = work_target("IdempotentTask", [ran(100, 2.0)], "naive", [ran(100, 1.0)])
    assert slow.verdict == "not met (useful work 0.50× the naive pattern's)"
