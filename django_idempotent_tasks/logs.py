"""The context of the running delivery, added to every log record of the package as ``extra`` fields."""

from __future__ import annotations

import contextvars
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from django_idempotent_tasks import signals

LOGGER = "django_idempotent_tasks"
#: The attributes every record of the package's logger carries (None outside a delivery).
FIELDS = (
    "task_id",
    "idempotency_scope",
    "idempotency_key_hash",
    "idempotency_fence",
    "idempotency_attempt",
    "idempotency_outcome",
)


@dataclass
class LogContext:
    """What is known so far about the delivery running in this context."""

    task_id: str
    scope: str
    key_hash: str
    fence: int | None = None
    attempt: int | None = None
    outcome: str = "started"

    def fields(self) -> dict[str, Any]:
        values = (self.task_id, self.scope, self.key_hash, self.fence, self.attempt, self.outcome)
        return dict(zip(FIELDS, values, strict=True))


current: contextvars.ContextVar[LogContext | None] = contextvars.ContextVar("idempotency_log", default=None)


def key_hash(key: str) -> str:
    """A short, stable hash of a key: enough to find its lines, without writing the key to the logs."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def enter(task_id: str, scope: str, key: str) -> contextvars.Token[LogContext | None]:
    """Start the log context of a delivery; ``leave()`` it with the token when the delivery ends."""
    return current.set(LogContext(task_id, scope, key_hash(key)))


def leave(token: contextvars.Token[LogContext | None]) -> None:
    """End the log context ``enter()`` started: lines after the delivery carry none of its fields."""
    current.reset(token)


def context() -> LogContext | None:
    """The context of the delivery running in this context (a heartbeat runs in a copy of it)."""
    return current.get()


class ContextFilter(logging.Filter):
    """Adds the :data:`FIELDS` of the running delivery to each record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        running = context()
        values = running.fields() if running is not None else dict.fromkeys(FIELDS)
        for name, value in values.items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


OUTCOMES = {
    signals.task_completed: "completed",
    signals.task_replayed: "replayed",
    signals.task_failed: "failed",
    signals.lock_conflict: "conflict",
    signals.lease_lost: "lease_lost",
    signals.attempts_exhausted: "exhausted",
    signals.result_unstorable: "unstorable",
}


def note(signal: Any, fence: int | None = None, attempt: int | None = None, **kwargs: Any) -> None:
    """Set the outcome a delivery is about to signal on its context (a claim also sets its fence)."""
    running = current.get()
    if running is None:
        return
    if signal is signals.task_claimed:
        running.fence, running.attempt, running.outcome = fence, attempt, "claimed"
    elif signal in OUTCOMES:  # not database_unreachable: the delivery is re-queued, its outcome open
        running.outcome = OUTCOMES[signal]


def install() -> None:
    """Attach the filter to the package's logger (idempotent); called by the app's ``ready()``."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(existing, ContextFilter) for existing in logger.filters):
        logger.addFilter(ContextFilter())
