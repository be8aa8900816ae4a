"""The verdicts of section 2, kept apart from the measuring so that a test can hand them any outcome.

Useful work counts the units whose effect exists exactly once; a target is met only when no unit
of the measured system (or of the baseline it is compared with) was lost and none ran twice.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

NOOP_TARGET = 0.6  # no-op body: at least this share of plain Celery's messages/s


@dataclass(frozen=True)
class Outcome:
    """One system's run of one batch: its time and what its bodies left behind."""

    seconds: float
    messages: int
    units: int  # distinct units of work in the batch
    once: int  # units whose effect exists exactly once
    duplicates: int  # effects beyond the first of a unit
    missing: int  # units with no effect: never ran, or ran and failed

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def useful_rate(self) -> float:
        return self.once / self.seconds


@dataclass(frozen=True)
class Target:
    target: str
    measured: str
    verdict: str  # "met", or "not met" and why


def losses(name: str, outcomes: list[Outcome]) -> list[str]:
    """What ``name`` lost or ran twice over its runs, one phrase each; empty when nothing."""
    missing = sum(o.missing for o in outcomes)
    duplicates = sum(o.duplicates for o in outcomes)
    found = []
    if missing:
        found.append(f"{name}: {missing} units never ran")
    if duplicates:
        found.append(f"{name}: {duplicates} duplicate effects")
    return found


def verdict(reached: bool, reasons: list[str], figure: str) -> str:
    """``met`` when the figure reached its target and nothing was lost or run twice."""
    if not reasons and reached:
        return "met"
    return "not met (" + "; ".join([*reasons, *([] if reached else [figure])]) + ")"


def work_target(name: str, ours: list[Outcome], naive_name: str, naive: list[Outcome]) -> Target:
    """5 ms body with redelivered duplicates: useful work/s at least the naive pattern's, losing nothing."""
    mine = statistics.median(o.useful_rate for o in ours)
    theirs = statistics.median(o.useful_rate for o in naive)
    ratio = mine / theirs if theirs else float("inf")
    duplicates = sum(o.duplicates for o in ours)
    missing = sum(o.missing for o in ours)
    return Target(
        f"{name}: useful work/s ≥ the naive pattern's, 0 duplicate effects, 0 units lost",
        f"{mine:,.0f} vs {theirs:,.0f} ({ratio:.2f}×), {duplicates} duplicates, {missing} never ran",
        verdict(
            theirs > 0 and mine >= theirs,
            losses(name, ours) + losses(naive_name, naive),
            f"useful work {ratio:.2f}× the naive pattern's",
        ),
    )


def noop_target(
    name: str, ratio: float, ours: list[Outcome], plain_name: str, plain: list[Outcome]
) -> Target:
    """No-op body: at least NOOP_TARGET of plain Celery's messages/s, every unit run once."""
    return Target(
        f"{name}: no-op ≥ {NOOP_TARGET}× plain, 0 units lost",
        f"{ratio:.2f}×, {sum(o.missing for o in ours)} never ran",
        verdict(ratio >= NOOP_TARGET, losses(name, ours) + losses(plain_name, plain), f"{ratio:.2f}× plain"),
    )
