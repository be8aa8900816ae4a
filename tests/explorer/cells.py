"""The explorer's cells: boundary × fault, which faults apply where, and the slice ``make test`` runs."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

FAULTS = ("child_kill", "main_kill", "db_kill", "ambiguous_commit", "lock_restart", "pause")
# Faults after which a body may legitimately run again (RELIABILITY.md W1, W4, W6): the holder
# died or stalled past its lease between its external call and its completion commit.
CRASHES = ("child_kill", "main_kill", "pause")
# The databases whose worker connections go through the drop proxy (ambiguous_commit).
PROXIED = ("postgresql", "mysql")


@dataclass(frozen=True)
class Boundary:
    """One boundary of a task kind's delivery, as the recording run passed it."""

    id: str  # "<io>:<label>#<occurrence>:<before|after>"
    in_main: bool  # passed in the worker's main process (Celery's ack), not in the pool child

    @property
    def phase(self) -> str:
        return self.id.rsplit(":", 1)[1]


@dataclass(frozen=True)
class Cell:
    kind: str
    boundary: str
    fault: str

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.boundary}:{self.fault}"

    @classmethod
    def parse(cls, text: str) -> Cell:
        kind, rest = text.split(":", 1)
        boundary, fault = rest.rsplit(":", 1)
        return cls(kind, boundary, fault)


def applicable(boundary: Boundary, fault: str, vendor: str) -> bool:
    """Whether ``fault`` means something at ``boundary`` (on this database)."""
    if boundary.in_main:
        return fault in ("main_kill", "lock_restart")
    if fault == "ambiguous_commit":
        # P2 needs the proxy, which carries the worker's TCP connections to the database; the
        # reply dropped is that of the statement about to be sent.
        return vendor in PROXIED and boundary.id.startswith("sql:") and boundary.phase == "before"
    return True


def full(kind: str, boundaries: list[Boundary], vendor: str) -> list[Cell]:
    return [Cell(kind, b.id, f) for b in boundaries for f in FAULTS if applicable(b, f, vendor)]


def rotating(kind: str, boundaries: list[Boundary], vendor: str, seed: int, skip: set[str]) -> list[Cell]:
    """Every boundary once, with one applicable fault rotating by ``seed`` (cells in ``skip`` are
    passed over for the next fault: they run as their own expected failures)."""
    cells = []
    for n, boundary in enumerate(boundaries):
        faults = [f for f in FAULTS if applicable(boundary, f, vendor)]
        for shift in range(len(faults)):
            cell = Cell(kind, boundary.id, faults[(seed + n + shift) % len(faults)])
            if cell.id not in skip:
                cells.append(cell)
                break
    return cells


def seed() -> int:
    return int(os.environ.get("EXPLORE_SEED") or random.randrange(10_000))


def mode() -> str:
    """``slice`` (make test), ``full`` (make explore) or one cell (``EXPLORE_CELL``)."""
    return "cell" if os.environ.get("EXPLORE_CELL") else os.environ.get("EXPLORE_MATRIX", "slice")
