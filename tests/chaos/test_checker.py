"""The checker tells a message we left unanswered (I5) from a copy the broker lost."""

from __future__ import annotations

from django_idempotent_tasks.models import IdempotencyRecord
from tests.chaos.checker import Observed, check

Status = IdempotencyRecord.Status


def unanswered(copy_lost: set[str]) -> Observed:
    """k-1's message was received, re-queued, and never answered."""
    record = IdempotencyRecord(key="k-1", status=Status.SUCCEEDED, fence=1, task_name="chaos.external")
    return Observed(
        keys={"k-1"},
        poison=set(),
        messages=[("t-1", "k-1")],
        records={"k-1": record},
        received={"t-1"},
        copy_lost=copy_lost,
    )


def test_a_received_message_left_unanswered_violates_i5() -> None:
    verdict = check(unanswered(copy_lost=set()), set(), set(), set(), [])
    assert verdict.violations == ["I5 k-1: message t-1 was received but never answered"]


def test_a_requeued_copy_the_broker_never_delivered_is_its_loss_not_ours() -> None:
    verdict = check(unanswered(copy_lost={"t-1"}), set(), set(), set(), [])
    assert verdict.violations == []
    assert verdict.notes == ["message t-1 of k-1: a copy never reached a worker (broker loss)"]
    assert verdict.figures["messages never delivered by the broker"] == 1
