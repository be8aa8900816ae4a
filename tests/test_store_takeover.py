"""Regression (found by the explorer): a takeover starts from the steps committed before it, not
from the snapshot its lookup read."""

from __future__ import annotations

from typing import Any

from django_idempotent_tasks import store
from tests.records import stuck


def test_take_over_sees_a_checkpoint_committed_after_the_lookup(db: Any) -> None:
    stuck("k", fence=1, attempts=1)
    snapshot = store.lookup("s", "k")
    assert snapshot is not None and snapshot.steps == {}
    # The old holder, paused past its lease, wakes up and commits its step before the takeover.
    old = store.Claim(record=snapshot, fence=1, attempt=1, recovered=False)
    assert store.checkpoint(old, {"a": 1})

    claim = store.take_over(snapshot, task_id="t2", worker="host:2", lease_seconds=60, record_ttl=60)

    assert claim is not None and claim.fence == 2
    assert claim.record.steps == {"a": 1}
