"""Regression: a delivery whose PostgreSQL connection breaks is sent again, not acked as failed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_idempotent_tasks.models import IdempotencyRecord
from tests import db_sessions
from tests.chaos.harness import lock_port
from tests.chaos.services import LockRedis, WorkerPool
from tests.chaosapp import control
from tests.chaosapp.models import ChaosEffect
from tests.chaosapp.tasks import chaos_effect
from tests.helpers import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.chaos]


@pytest.fixture
def chaos_worker(worker_env: dict[str, str], transactional_db: Any) -> Iterator[WorkerPool]:
    lock_redis = LockRedis(lock_port())
    pool = WorkerPool({**worker_env, "IDEMPOTENT_TESTS_LOCK_REDIS_URL": lock_redis.url}, size=1)
    try:
        lock_redis.start()
        pool.start()
        yield pool
    finally:
        pool.stop()
        lock_redis.stop()


def terminate(backends: list[int]) -> None:
    for backend in backends:
        db_sessions.terminate(backend)


def answer(task_id: str) -> Any:
    return chaos_effect.AsyncResult(task_id).get(timeout=90, propagate=False)


def test_backend_killed_mid_transaction_is_retried_once(chaos_worker: WorkerPool) -> None:
    control.arm("after_effect", "p1", "hold:5")
    task_id = str(uuid.uuid4())
    chaos_effect.apply_async((1,), {"idempotency_key": "p1"}, task_id=task_id)
    backend = int(
        wait_for(lambda: control.control().get("held:p1"), timeout=60, what="the holder").split()[1]
    )
    terminate([backend])

    result = answer(task_id)

    assert result == {"key": "p1", "value": 1, "fence": 2, "pid": result["pid"]}
    record = IdempotencyRecord.objects.get(key="p1")
    assert (record.status, record.fence, record.result) == ("SUCCEEDED", 2, result)
    assert list(ChaosEffect.objects.filter(key="p1").values_list("fence", flat=True)) == [2]


def test_idle_connection_killed_between_tasks_is_retried(chaos_worker: WorkerPool) -> None:
    assert answer(chaos_effect.delay(1, idempotency_key="warm-up").id)["fence"] == 1
    terminate(db_sessions.other_backends())

    result = answer(chaos_effect.delay(2, idempotency_key="after-restart").id)

    assert result["fence"] == 1
    assert IdempotencyRecord.objects.get(key="after-restart").status == "SUCCEEDED"
    assert ChaosEffect.objects.filter(key="after-restart").count() == 1
