"""Celery's control flow from the body (replace, Ignore, Reject) in real workers."""

from __future__ import annotations

import pytest

from django_idempotent_tasks import keys
from django_idempotent_tasks.tasks import HANDED_ON
from tests.helpers import SETTLE_TIMEOUT, Worker, finished, replays, wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.workers


@pytest.mark.parametrize("how", ["replace", "ignore"])
def test_a_body_that_hands_its_work_on_is_done_and_never_runs_again(
    running_workers: list[Worker], how: str
) -> None:
    key = f"hands-on-{how}"
    tasks.hands_on.delay(1, how, idempotency_key=key)
    record = finished(key)
    assert record.result == HANDED_ON
    if how == "replace":
        finished(keys.subkey(tasks.hands_on.name, key, "next"))
    tasks.hands_on.delay(1, how, idempotency_key=key)  # a redelivery of the same work
    wait_for(lambda: replays(key) == 1, timeout=SETTLE_TIMEOUT, what="the redelivery to replay")
    assert Effect.objects.filter(key=key).count() == 1
    assert Effect.objects.filter(task=tasks.record_effect.name).count() == (1 if how == "replace" else 0)


def test_a_rejected_message_leaves_the_key_retryable(running_workers: list[Worker]) -> None:
    tasks.hands_on.delay(1, "reject", idempotency_key="rejected")
    record = finished("rejected", "FAILED")
    assert record.error is not None and record.error["type"] == "Reject"
    tasks.hands_on.delay(1, "reject", idempotency_key="rejected")  # an operator replays it
    wait_for(
        lambda: Effect.objects.filter(key="rejected").count() == 2, timeout=SETTLE_TIMEOUT, what="a rerun"
    )
