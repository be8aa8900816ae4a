"""The guarantee with real ``celery worker -P prefork`` processes: 2 workers x 2 children."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from django_idempotent_tasks import keys
from django_idempotent_tasks.models import IdempotencyRecord
from tests import brokers
from tests.helpers import (
    SETTLE_TIMEOUT,
    Worker,
    body_pid,
    conflicts,
    errors,
    finished,
    lapsed,
    leases_lost,
    outlive_lease,
    replays,
    wait_for,
)
from tests.testapp import tasks
from tests.testapp.faults import arm, control
from tests.testapp.models import Effect

pytestmark = pytest.mark.workers


def test_a_second_delivery_replays_the_stored_result(running_workers: list[Worker]) -> None:
    first = tasks.concurrent_effect.delay(1, 0, idempotency_key="replay").get(timeout=60)
    second = tasks.concurrent_effect.delay(1, 0, idempotency_key="replay").get(timeout=60)
    assert first == second == {"value": 1, "fence": 1}
    assert Effect.objects.filter(key="replay").count() == 1


def test_20_concurrent_deliveries_run_the_body_once(running_workers: list[Worker]) -> None:
    results = [tasks.concurrent_effect.delay(7, idempotency_key="burst") for _ in range(20)]
    answers = [result.get(timeout=120) for result in results]
    assert answers == [{"value": 7, "fence": 1}] * 20
    assert Effect.objects.filter(key="burst").count() == 1
    assert [errors("burst"), conflicts("burst").count("raise")] == [[], 0]  # no claim race surfaced


def test_crash_after_completion_before_the_ack_replays(running_workers: list[Worker]) -> None:
    arm("postrun", "w2")
    tasks.record_effect.delay(2, idempotency_key="w2")
    finished("w2")
    wait_for(lambda: replays("w2"), timeout=SETTLE_TIMEOUT, what="the redelivery to replay")
    assert Effect.objects.filter(key="w2").count() == 1


def test_crash_mid_body_is_taken_over_after_the_lease(running_workers: list[Worker]) -> None:
    arm("after_effect", "w1")
    tasks.short_lease.delay(1, idempotency_key="w1")
    done = finished("w1")
    effects = list(Effect.objects.filter(key="w1").order_by("pk").values_list("fence", "recovered"))
    assert effects == [(1, False), (2, True)]
    assert (done.fence, done.attempts, done.result) == (2, 2, {"value": 1, "fence": 2})


def test_renewal_keeps_a_short_lock_through_a_long_body(running_workers: list[Worker]) -> None:
    tasks.short_lease.delay(5, 5, idempotency_key="w7")
    body_pid("w7")
    outlive_lease("w7")  # without renewal the lock and the lease would be gone now
    assert IdempotencyRecord.objects.get(key="w7").lease_is_live
    tasks.short_lease.delay(5, 5, idempotency_key="w7")
    done = finished("w7")
    assert done.fence == 1
    wait_for(lambda: replays("w7"), timeout=SETTLE_TIMEOUT, what="the duplicate to replay")
    assert Effect.objects.filter(key="w7").count() == 1


def test_losing_the_redis_lock_mid_run_leaves_the_database_lease_in_charge(
    running_workers: list[Worker], lock_redis: redis.Redis
) -> None:
    tasks.record_effect.delay(1, 4, idempotency_key="flushed")
    wait_for(lambda: Effect.objects.filter(key="flushed").exists(), timeout=60, what="the body to run")
    lock_redis.flushdb()
    tasks.record_effect.delay(1, 4, idempotency_key="flushed")
    finished("flushed")
    wait_for(lambda: replays("flushed"), timeout=SETTLE_TIMEOUT, what="the duplicate to replay")
    assert Effect.objects.filter(key="flushed").count() == 1
    assert "retry" in conflicts("flushed")  # the database lease turned the duplicate away


@pytest.mark.row_locks
def test_a_paused_atomic_holder_loses_its_lease_and_its_writes(running_workers: list[Worker]) -> None:
    tasks.short_lease_atomic.delay(1, 4, idempotency_key="w6")
    pid = body_pid("w6")
    os.kill(pid, signal.SIGSTOP)
    try:
        lapsed(tasks.short_lease_atomic.name, "w6")
        control().delete("pid:w6")
        tasks.short_lease_atomic.delay(1, 4, idempotency_key="w6")
        done = finished("w6")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(
        lambda: 1 in leases_lost("w6"),
        timeout=SETTLE_TIMEOUT,
        what="the paused holder to find its lease lost",
    )
    assert done.fence == 2
    assert list(Effect.objects.filter(key="w6").values_list("fence", flat=True)) == [2]


def test_self_retry_counts_attempts_and_never_blocks_on_its_own_lock(running_workers: list[Worker]) -> None:
    tasks.retrying.delay(2, idempotency_key="retry")
    done = finished("retry")
    assert (done.attempts, done.fence) == (3, 3)
    assert Effect.objects.filter(key="retry").count() == 3
    assert conflicts("retry") == []


def test_autoretry_after_a_failure_runs_again(running_workers: list[Worker]) -> None:
    tasks.autoretrying.delay(1, idempotency_key="autoretry")
    done = finished("autoretry")
    assert (done.attempts, done.result) == (2, {"value": 1, "fence": 2})


def test_conflict_retries_do_not_use_up_max_retries(running_workers: list[Worker]) -> None:
    first = tasks.no_retries.delay(3, idempotency_key="patient")
    body_pid("patient")
    second = tasks.no_retries.delay(3, idempotency_key="patient")
    assert second.get(timeout=90) == first.get(timeout=90) == {"value": 3, "fence": 1, "retries": 0}
    assert "retry" in conflicts("patient")


def test_a_poison_task_fails_for_good_after_max_attempts(running_workers: list[Worker]) -> None:
    tasks.poison.delay(idempotency_key="poison")
    done = finished("poison", status="FAILED")
    assert done.error is not None and done.error["type"] == "AttemptsExhausted"
    assert Effect.objects.filter(key="poison").count() == 2
    wait_for(
        lambda: brokers.pending() == 0,
        timeout=60,
        what="the poison message to leave the broker",
    )


def test_lock_names_in_redis_are_hashed(running_workers: list[Worker], lock_redis: redis.Redis) -> None:
    tasks.short_lease.delay(1, 3, idempotency_key="customer@example.com")
    body_pid("customer@example.com")
    names = [name.decode() if isinstance(name, bytes) else name for name in lock_redis.keys("*")]
    assert names == [keys.lock_name(tasks.short_lease.name, "customer@example.com")]
    finished("customer@example.com")


def test_a_hard_time_limit_frees_the_key_for_the_next_delivery(running_workers: list[Worker]) -> None:
    tasks.too_slow.delay(idempotency_key="w8")
    done = finished("w8", status="FAILED")
    assert done.error is not None and done.error["type"] == "TimeLimitExceeded"
    assert not done.lease_is_live
    assert Effect.objects.filter(key="w8").count() == 1
