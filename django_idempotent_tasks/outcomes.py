"""What one delivery did, as values: the front ends (a Celery task, ``@idempotent``) act on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The stored result of a key whose body replaced itself (``self.replace``) or raised ``Ignore``.
HANDED_ON = {"django_idempotent_tasks.handed_on": True}


@dataclass(frozen=True)
class Replayed:
    """The key was already done: the stored value, and the body did not run."""

    value: Any


@dataclass(frozen=True)
class Completed:
    """The body ran under this delivery's lease and was marked done: its value as stored, and why
    the value itself could not be stored (the key is done all the same), if it could not."""

    value: Any
    unstorable: str | None = None


@dataclass(frozen=True)
class Busy:
    """Another delivery holds the key: ``action`` is the on_conflict action left to take ("retry",
    "raise", or "wait" when waiting ran out), ``message`` the TaskInProgress text."""

    action: str
    message: str


@dataclass(frozen=True)
class Requeue:
    """The delivery cannot run now (Redis unreachable, database connection lost): send it again."""

    reason: str


Outcome = Replayed | Completed | Busy | Requeue
