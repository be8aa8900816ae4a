"""The context of the running delivery, added to every log record of the package as ``extra`` fields."""

from __future__ import annotations

import contextvars
import hashlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

from celery import signals as celery_signals

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


def begin(task_id: str, scope: str, key: str) -> None:
    """Start the log context of a delivery (called first thing in ``deliver()``)."""
    current.set(LogContext(task_id, scope, key_hash(key)))


def follow(heartbeat: threading.Thread) -> None:
    """Let a delivery's heartbeat thread log under the delivery's context (called before it starts)."""
    # A new thread starts with an empty context, so the heartbeat carries this one along.
    heartbeat.idempotency_log_context = current.get()  # type: ignore[attr-defined]


def context() -> LogContext | None:
    """The context of the delivery running in this thread (or whose heartbeat this thread is)."""
    found = current.get()
    if found is None:
        found = getattr(threading.current_thread(), "idempotency_log_context", None)
    return found


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


def _outcome(signal: Any, **kwargs: Any) -> None:
    running = context()
    if running is not None:
        running.outcome = OUTCOMES[signal]


def _claimed(fence: int, attempt: int, **kwargs: Any) -> None:
    running = context()
    if running is not None:
        running.fence, running.attempt, running.outcome = fence, attempt, "claimed"


def _end(**kwargs: Any) -> None:
    current.set(None)


def install() -> None:
    """Attach the filter to the package's logger and follow the deliveries' signals (idempotent)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(existing, ContextFilter) for existing in logger.filters):
        logger.addFilter(ContextFilter())
    signals.task_claimed.observe(f"{LOGGER}.logs", _claimed)
    for signal in OUTCOMES:
        signal.observe(f"{LOGGER}.logs", _outcome)
    celery_signals.task_postrun.connect(_end, weak=False, dispatch_uid=f"{LOGGER}.logs")


install()
