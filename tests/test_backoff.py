"""Deliveries re-queued by a conflict back off exponentially with jitter, capped (real workers)."""

from __future__ import annotations

import json
import time

import pytest
from django.test import override_settings

from django_idempotent_tasks.conf import conflict_countdown
from tests.helpers import Worker
from tests.testapp import tasks
from tests.testapp.faults import control
from tests.testapp.models import Effect

DUPLICATES = 20
BODY_SECONDS = 2
TIMEOUT = 180
SLACK = 1.0  # the eta is written a moment after the countdown is drawn, and rounded by Celery


def test_the_countdown_doubles_with_full_jitter_within_the_cap() -> None:
    with override_settings(IDEMPOTENT_TASKS_CONFLICT_RETRY_DELAY=1):
        for conflicts in range(8):
            drawn = {conflict_countdown(conflicts, lock_ttl=30) for _ in range(200)}
            assert min(drawn) >= 1
            assert max(drawn) <= min(30, 2**conflicts)
        assert max(conflict_countdown(10, lock_ttl=30) for _ in range(200)) > 8  # jitter spreads them
    with override_settings(IDEMPOTENT_TASKS_CONFLICT_RETRY_DELAY=5):
        assert {conflict_countdown(3, lock_ttl=2) for _ in range(50)} == {5}  # never below the delay


@pytest.mark.workers
def test_duplicates_of_a_long_body_back_off_and_settle(running_workers: list[Worker]) -> None:
    started = time.monotonic()
    results = [
        tasks.concurrent_effect.delay(3, BODY_SECONDS, idempotency_key="backoff") for _ in range(DUPLICATES)
    ]
    answers = [result.get(timeout=TIMEOUT) for result in results]
    elapsed = time.monotonic() - started
    requeues = [json.loads(raw) for raw in control().lrange("requeues", 0, -1)]
    print(  # noqa: T201  (the figure the brief asks for; no timed assertion)
        f"\n{DUPLICATES} duplicates of a {BODY_SECONDS} s body settled in {elapsed:.1f} s "
        f"with {len(requeues)} conflict re-queues"
    )
    assert answers == [{"value": 3, "fence": 1}] * DUPLICATES
    assert Effect.objects.filter(key="backoff").count() == 1
    assert requeues, "no delivery met the holder"
    assert max(conflicts for conflicts, _ in requeues) >= 2  # the count travels with the message
    for conflicts, delay in requeues:
        assert delay <= min(60, 2 ** (conflicts - 1)) + SLACK, (conflicts, delay)
