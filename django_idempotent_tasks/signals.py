"""Signals sent on every path of a delivery that is not the plain first run, and a few that are."""

from __future__ import annotations

from typing import Any

from celery.local import Proxy
from django.dispatch import Signal


def _task(sender: Any) -> Any:
    # shared_task hands out a proxy, but a delivery sends the task object itself: resolve the
    # proxy when connecting, as Celery's own signals do (celery.utils.dispatch.signal._make_id).
    if isinstance(sender, Proxy):
        return sender._get_current_object()
    # An @idempotent function (or a django.tasks task around one) sends from its spec.
    return getattr(sender, "idempotent", None) or getattr(getattr(sender, "func", None), "idempotent", sender)


class TaskSignal(Signal):
    """A signal whose ``sender=`` may be a ``shared_task``, and whose receivers cannot break a delivery.

    A receiver that raises is logged (logger ``django.dispatch``) and skipped: ``send`` is
    ``send_robust``, so no receiver leaves a key IN_PROGRESS or changes a delivery's outcome.
    A signal nobody connected to costs no dispatch on the delivery path.
    """

    def connect(self, receiver: Any, sender: Any = None, weak: bool = True, dispatch_uid: Any = None) -> None:
        super().connect(receiver, _task(sender), weak, dispatch_uid)

    def disconnect(self, receiver: Any = None, sender: Any = None, dispatch_uid: Any = None) -> bool:
        return super().disconnect(receiver, _task(sender), dispatch_uid)

    def send(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        if not self.receivers:  # nobody listens: no receiver lookup, no dispatch
            return []
        return self.send_robust(sender, **named)


#: A delivery claimed a key. kwargs: key, scope, fence, attempt, recovered.
task_claimed = TaskSignal()
#: A claimed delivery stored its result (atomic: after the commit). kwargs: key, scope, fence.
task_completed = TaskSignal()
#: A delivery returned the stored result without running the body. kwargs: key, scope.
task_replayed = TaskSignal()
#: The body raised; the record is FAILED and retryable. kwargs: key, scope, fence, exc.
task_failed = TaskSignal()
#: Another delivery held the key. kwargs: key, scope, action ("retry", "wait" or "raise").
lock_conflict = TaskSignal()
#: A holder lost its lease (renewal or completion refused). kwargs: key, scope, fence.
lease_lost = TaskSignal()
#: A key used up its attempts. kwargs: key, scope, attempts.
attempts_exhausted = TaskSignal()
#: A result could not be stored (not JSON or too large). kwargs: key, scope, reason.
result_unstorable = TaskSignal()
#: The records' database stayed unreachable for longer than a lease (logged as an ERROR at most once
#: per lease and process; the delivery is re-queued). kwargs: key, scope, alias, error, seconds.
database_unreachable = TaskSignal()
