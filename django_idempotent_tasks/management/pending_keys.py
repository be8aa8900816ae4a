"""The outbox's PENDING keys older than the re-drive age: what ``idempotency_status`` says of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_idempotent_tasks import outbox
from django_idempotent_tasks.conf import conf

NEXT_STEP = (
    "Their messages were lost or are late: run `python manage.py redrive_idempotency_records` to send "
    "them again, and check that the beat schedule runs django_idempotent_tasks.redrive_pending_records "
    "(`manage.py check --deploy` warns when it does not)."
)


@dataclass(frozen=True)
class OverduePending:
    """How many PENDING records are older than ``redrive_after`` seconds: the re-drive owes them a send."""

    count: int
    redrive_after: int

    def lines(self) -> list[str]:
        """The count as text, and the next step when there are any."""
        line = f"Overdue PENDING keys (older than the re-drive age, {self.redrive_after:,} s): {self.count:,}"
        return [line, f"  {NEXT_STEP}"] if self.count else [line]

    def as_json(self) -> dict[str, Any]:
        """The count as JSON fields of the overview."""
        return {
            "overdue_pending": self.count,
            "redrive_after": self.redrive_after,
            "next_step": NEXT_STEP if self.count else None,
        }


def overdue(pending: int) -> OverduePending:
    """The PENDING records the re-drive would send now, counted only when there are PENDING records."""
    after = conf.REDRIVE_AFTER
    # The re-drive's own rule (outbox.redrivable): REDRIVE_AFTER seconds past the last send and the ETA.
    return OverduePending(len(outbox.redrivable(after)) if pending else 0, after)
