"""Celery's control flow from the body (replace, Ignore, Reject) in real workers."""

from __future__ import annotations

import pytest

from django_idempotent_tasks import keys
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.tasks import HANDED_ON
from tests.helpers import Worker, wait_for
from tests.testapp import tasks
from tests.testapp.faults import control
from tests.testapp.models import Effect

pytestmark = pytest.mark.workers
TIMEOUT = 90


def settled(key: str, status: str) -> IdempotencyRecord:
    record: IdempotencyRecord = wait_for(
        lambda: IdempotencyRecord.objects.filter(key=key, status=status).first(),
        timeout=TIMEOUT,
        what=f"{key} to be {status}",
    )
    return record


def replayed(key: str) -> int:
    return int(control().get(f"replayed:{key}") or 0)


@pytest.mark.parametrize("how", ["replace", "ignore"])
def test_a_body_that_hands_its_work_on_is_done_and_never_runs_again(
    running_workers: list[Worker], how: str
) -> None:
    key = f"hands-on-{how}"
    tasks.hands_on.delay(1, how, idempotency_key=key)
    record = settled(key, "SUCCEEDED")
    assert record.result == HANDED_ON
    if how == "replace":
        settled(keys.subkey(tasks.hands_on.name, key, "next"), "SUCCEEDED")
    tasks.hands_on.delay(1, how, idempotency_key=key)  # a redelivery of the same work
    wait_for(lambda: replayed(key) == 1, timeout=TIMEOUT, what="the redelivery to replay")
    assert Effect.objects.filter(key=key).count() == 1
    assert Effect.objects.filter(task=tasks.record_effect.name).count() == (1 if how == "replace" else 0)


def test_a_rejected_message_leaves_the_key_retryable(running_workers: list[Worker]) -> None:
    tasks.hands_on.delay(1, "reject", idempotency_key="rejected")
    record = settled("rejected", "FAILED")
    assert record.error is not None and record.error["type"] == "Reject"
    tasks.hands_on.delay(1, "reject", idempotency_key="rejected")  # an operator replays it
    wait_for(lambda: Effect.objects.filter(key="rejected").count() == 2, timeout=TIMEOUT, what="a rerun")
