"""The stuck keys, oldest first, and the next step for each: what ``idempotency_status --stuck`` says."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import timezone
from typing import Any

from django_idempotent_tasks import store
from django_idempotent_tasks.management import key_state
from django_idempotent_tasks.models import IdempotencyRecord

DEFAULT_LIMIT = 50
BROKER_NOTE = (
    "A broker may still hold the message of a stuck key (acks_late): once the key is released, "
    "that message runs the body again, as the next delivery would."
)
WAIT_NOTE = (
    "Nothing needs doing for a key whose message is still queued: its next delivery takes the key "
    "over by itself (self.idempotency.recovered is True). Release a key to let a new delivery run it now."
)


def next_step(record: IdempotencyRecord) -> str:
    """The command that frees ``record``'s key."""
    return (
        f"python manage.py release_idempotency_lock {shlex.quote(record.key)} "
        f"--scope {shlex.quote(record.scope)}"
    )


@dataclass(frozen=True)
class StuckKeys:
    """The oldest stuck records (at most ``limit``) and how many there are in all."""

    records: list[IdempotencyRecord]
    total: int

    def lines(self) -> list[str]:
        """The listing as text."""
        if not self.total:
            return ["No stuck keys."]
        shown = f", the oldest {len(self.records)}" if len(self.records) < self.total else ""
        lines = [f"Stuck keys (IN_PROGRESS, lease expired): {self.total:,}{shown}"]
        for record in self.records:
            lines += [
                f"  {key_state.label(record.scope, record.key)} ({record.task_name})",
                f"    Held by {record.worker or '-'} (task {record.task_id or '-'}, attempt "
                f"{record.attempts}, fence {record.fence}); {key_state.lease(record)}",
                f"    Next step: {next_step(record)}",
            ]
        return [*lines, WAIT_NOTE, BROKER_NOTE]

    def as_json(self) -> dict[str, Any]:
        """The listing as one JSON object."""
        return {
            "stuck": self.total,
            "keys": [
                {
                    "scope": record.scope,
                    "key": record.key,
                    "task_name": record.task_name,
                    "worker": record.worker,
                    "task_id": record.task_id,
                    "attempts": record.attempts,
                    "fence": record.fence,
                    "lease_expires_at": None
                    if record.lease_expires_at is None
                    else record.lease_expires_at.astimezone(timezone.utc).isoformat(),
                    "next_step": next_step(record),
                }
                for record in self.records
            ],
            "notes": [WAIT_NOTE, BROKER_NOTE],
        }


def oldest(limit: int) -> StuckKeys:
    """The ``limit`` stuck records whose lease expired first, and the count of all stuck records."""
    stuck = store.records().stuck()
    found = list(
        stuck.defer("result", "error", "steps", "attempts_log").order_by("lease_expires_at", "pk")[:limit]
    )
    total = len(found) if len(found) < limit else stuck.count()
    return StuckKeys(found, total)
