"""Signals sent on every path of a delivery that is not the plain first run, and a few that are."""

from __future__ import annotations

from django.dispatch import Signal

#: A delivery claimed a key. kwargs: key, scope, fence, attempt, recovered.
task_claimed = Signal()
#: A claimed delivery stored its result. kwargs: key, scope, fence.
task_completed = Signal()
#: A delivery returned the stored result without running the body. kwargs: key, scope.
task_replayed = Signal()
#: The body raised; the record is FAILED and retryable. kwargs: key, scope, fence, exc.
task_failed = Signal()
#: Another delivery held the key. kwargs: key, scope, action ("retry", "wait" or "raise").
lock_conflict = Signal()
#: A holder lost its lease (renewal or completion refused). kwargs: key, scope, fence.
lease_lost = Signal()
#: A key used up its attempts. kwargs: key, scope, attempts.
attempts_exhausted = Signal()
#: A result could not be stored (not JSON or too large). kwargs: key, scope, reason.
result_unstorable = Signal()
