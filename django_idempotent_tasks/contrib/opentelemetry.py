"""OpenTelemetry spans for the deliveries' signals: ``pip install django-idempotent-tasks[opentelemetry]``.

Call ``connect()`` once in the worker (after your tracer provider is set up): each delivery that
reaches the key gets a span ``idempotency <task name>``, a child of the current span (Celery's own
when opentelemetry-instrumentation-celery is active), with an event per step (claim, take-over,
replay, conflict, lease lost, unstorable result, failure) and ``idempotency.*`` attributes. The key
itself is never recorded: only its hash (``idempotency.key_hash``, as in the log lines), since
keys may carry personal data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from celery import signals as celery_signals
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from django_idempotent_tasks import signals
from django_idempotent_tasks.logs import key_hash

PREFIX = "idempotency"
UID = "django_idempotent_tasks.contrib.opentelemetry"

# The open span of each key this context is delivering (a task may deliver another eagerly), the
# outcome to record if Celery's task ends before a signal tells one, its task id and the thread
# that opened it.
_open: ContextVar[dict[tuple[str, str], tuple[Span, list[Any]]] | None] = ContextVar(
    "idempotency_spans", default=None
)
_tracer: Tracer | None = None


def _span(sender: Any, key: str, scope: str) -> Span:
    """The span of this delivery of ``scope:key``, started at its first signal."""
    spans = _open.get()
    if spans is None:
        spans = {}
        _open.set(spans)
    found = spans.get((scope, key))
    if found is None:
        assert _tracer is not None
        name = getattr(sender, "name", str(sender))
        span = _tracer.start_span(
            f"{PREFIX} {name}",
            attributes={
                f"{PREFIX}.task": name,
                f"{PREFIX}.scope": scope,
                f"{PREFIX}.key_hash": key_hash(key),
            },
        )
        task_id = getattr(getattr(sender, "request", None), "id", None)
        found = spans[(scope, key)] = (span, ["busy", task_id, threading.get_ident()])
    return found[0]


def _end(key: str, scope: str, outcome: str) -> None:
    spans = _open.get() or {}
    found = spans.pop((scope, key), None)
    if found is not None:
        found[0].set_attribute(f"{PREFIX}.outcome", outcome)
        found[0].end()


def on_claimed(
    sender: Any, key: str, scope: str, fence: int, attempt: int, recovered: bool, **kw: Any
) -> None:
    span = _span(sender, key, scope)
    details = {f"{PREFIX}.fence": fence, f"{PREFIX}.attempt": attempt, f"{PREFIX}.recovered": recovered}
    span.set_attributes(details)
    span.add_event(f"{PREFIX}.take_over" if recovered else f"{PREFIX}.claim", details)


def on_completed(sender: Any, key: str, scope: str, fence: int, **kw: Any) -> None:
    _span(sender, key, scope).add_event(f"{PREFIX}.completed", {f"{PREFIX}.fence": fence})
    _end(key, scope, "completed")


def on_replayed(sender: Any, key: str, scope: str, **kw: Any) -> None:
    _span(sender, key, scope).add_event(f"{PREFIX}.replay")
    _end(key, scope, "replayed")


def on_failed(sender: Any, key: str, scope: str, fence: int, exc: BaseException, **kw: Any) -> None:
    span = _span(sender, key, scope)
    span.add_event(f"{PREFIX}.failed", {f"{PREFIX}.fence": fence, "exception.type": type(exc).__name__})
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    _end(key, scope, "failed")


def on_conflict(sender: Any, key: str, scope: str, action: str, **kw: Any) -> None:
    span = _span(sender, key, scope)
    span.add_event(f"{PREFIX}.conflict", {f"{PREFIX}.action": action})
    if action != "wait":  # a waiting delivery goes on: it may still claim or replay
        _end(key, scope, "conflict")


def on_lease_lost(sender: Any, key: str, scope: str, fence: int, **kw: Any) -> None:
    # The heartbeat finds a lost lease off the delivery's thread, in a copy of its context that sees
    # the open span: only the delivery's own thread records it, when its completion is refused.
    found = (_open.get() or {}).get((scope, key))
    if found is not None and found[1][2] == threading.get_ident():
        found[0].add_event(f"{PREFIX}.lease_lost", {f"{PREFIX}.fence": fence})
        found[1][0] = "lease_lost"


def on_unstorable(sender: Any, key: str, scope: str, reason: str, **kw: Any) -> None:
    span = _span(sender, key, scope)
    span.add_event(f"{PREFIX}.unstorable", {f"{PREFIX}.reason": reason})


def on_exhausted(sender: Any, key: str, scope: str, attempts: int, **kw: Any) -> None:
    span = _span(sender, key, scope)
    span.add_event(f"{PREFIX}.exhausted", {f"{PREFIX}.attempts": attempts})
    span.set_status(Status(StatusCode.ERROR, "AttemptsExhausted"))
    _end(key, scope, "exhausted")


def on_task_postrun(task_id: str | None = None, **kw: Any) -> None:
    """End what this task's delivery left open (a wait that ran out, a lost lease): it is over."""
    for (scope, key), (_span, state) in list((_open.get() or {}).items()):
        if state[1] == task_id:
            _end(key, scope, state[0])


RECEIVERS: tuple[tuple[signals.TaskSignal, Callable[..., None]], ...] = (
    (signals.task_claimed, on_claimed),
    (signals.task_completed, on_completed),
    (signals.task_replayed, on_replayed),
    (signals.task_failed, on_failed),
    (signals.lock_conflict, on_conflict),
    (signals.lease_lost, on_lease_lost),
    (signals.result_unstorable, on_unstorable),
    (signals.attempts_exhausted, on_exhausted),
)


def connect(tracer_provider: Any = None) -> None:
    """Trace the deliveries with ``tracer_provider`` (default: the global one); idempotent."""
    global _tracer
    _tracer = trace.get_tracer(UID, tracer_provider=tracer_provider)
    for signal, receiver in RECEIVERS:
        signal.connect(receiver, weak=False, dispatch_uid=UID)
    celery_signals.task_postrun.connect(on_task_postrun, weak=False, dispatch_uid=UID)


def disconnect() -> None:
    """Stop tracing the deliveries."""
    for signal, _receiver in RECEIVERS:
        signal.disconnect(dispatch_uid=UID)
    celery_signals.task_postrun.disconnect(on_task_postrun, dispatch_uid=UID)
