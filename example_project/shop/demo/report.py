"""The demo's progress lines and final table, every number taken from an ``Outcome``."""

from __future__ import annotations

from collections.abc import Sequence

from shop.demo.scenarios import Outcome

HEADER = ("#", "scenario", "deliveries", "charges: plain task", "charges: idempotent task", "replays")
NOTE = (
    "deliveries: of the plain / the idempotent task's messages, conflict re-queues included.\n"
    "replays: deliveries of the idempotent task answered from its stored result."
)


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


def progress(outcome: Outcome) -> str:
    """The line printed when a scenario has finished."""
    return (
        f"plain task: {plural(outcome.charges_plain, 'charge')} in {plural(outcome.deliveries_plain, 'delivery', 'deliveries')}; "
        f"idempotent task: {plural(outcome.charges_idempotent, 'charge')} in "
        f"{plural(outcome.deliveries_idempotent, 'delivery', 'deliveries')}, {plural(outcome.replays, 'replay')} "
        f"({outcome.seconds:.1f} s)"
    )


def table(outcomes: Sequence[Outcome]) -> str:
    """The summary table, one row per scenario."""
    rows = [
        (
            str(o.number),
            o.title,
            f"{o.deliveries_plain} / {o.deliveries_idempotent}",
            str(o.charges_plain),
            str(o.charges_idempotent),
            str(o.replays),
        )
        for o in outcomes
    ]
    widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]

    def line(cells: Sequence[str]) -> str:
        left = [cells[i].ljust(widths[i]) for i in (0, 1)]
        right = [cells[i].rjust(widths[i]) for i in range(2, len(cells))]
        return "  ".join(left + right).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(HEADER), rule, *(line(row) for row in rows), rule, NOTE])


def duplicates(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Scenarios whose idempotent order was not charged exactly once."""
    return [o for o in outcomes if o.charges_idempotent != 1]
