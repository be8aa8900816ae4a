"""The guarantee with real ``celery worker -P prefork`` processes: 2 workers x 2 children."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from django_idempotent_tasks import keys
from django_idempotent_tasks.models import IdempotencyRecord
from tests import brokers
from tests.helpers import Worker, wait_for
from tests.testapp import tasks
from tests.testapp.faults import arm, control
from tests.testapp.models import Effect

pytestmark = pytest.mark.workers


def record(key: str) -> IdempotencyRecord | None:
    return IdempotencyRecord.objects.filter(key=key).first()


def finished(key: str, status: str = "SUCCEEDED") -> IdempotencyRecord:
    done: IdempotencyRecord = wait_for(
        lambda: IdempotencyRecord.objects.filter(key=key, status=status).first(),
        timeout=90,
        what=f"{key} to be {status}",
    )
    return done


def logged(workers: list[Worker], text: str) -> bool:
    return any(text in worker.output() for worker in workers)


def body_pid(key: str) -> int:
    return int(wait_for(lambda: control().get(f"pid:{key}"), timeout=60, what=f"{key}'s body to start"))


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
    assert not logged(running_workers, "IntegrityError")


def test_crash_after_completion_before_the_ack_replays(running_workers: list[Worker]) -> None:
    arm("postrun", "w2")
    tasks.record_effect.delay(2, idempotency_key="w2")
    finished("w2")
    label = f"{tasks.record_effect.name}[w2] already succeeded; replaying"
    wait_for(lambda: logged(running_workers, label), timeout=90, what="the redelivery to replay")
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
    time.sleep(3)  # past lock_ttl=2: without renewal the lock and lease would be gone
    assert IdempotencyRecord.objects.get(key="w7").lease_is_live
    tasks.short_lease.delay(5, 5, idempotency_key="w7")
    done = finished("w7")
    assert done.fence == 1
    wait_for(
        lambda: logged(running_workers, f"{tasks.short_lease.name}[w7] already succeeded"),
        timeout=60,
        what="the duplicate to replay",
    )
    assert Effect.objects.filter(key="w7").count() == 1


def test_losing_the_redis_lock_mid_run_leaves_the_database_lease_in_charge(
    running_workers: list[Worker], lock_redis: redis.Redis
) -> None:
    tasks.record_effect.delay(1, 4, idempotency_key="flushed")
    wait_for(lambda: Effect.objects.filter(key="flushed").exists(), timeout=60, what="the body to run")
    lock_redis.flushdb()
    tasks.record_effect.delay(1, 4, idempotency_key="flushed")
    finished("flushed")
    wait_for(
        lambda: logged(running_workers, f"{tasks.record_effect.name}[flushed] already succeeded"),
        timeout=60,
        what="the duplicate to replay",
    )
    assert Effect.objects.filter(key="flushed").count() == 1
    assert logged(running_workers, f"{tasks.record_effect.name}[flushed] is held by another delivery")


@pytest.mark.row_locks
def test_a_paused_atomic_holder_loses_its_lease_and_its_writes(running_workers: list[Worker]) -> None:
    tasks.short_lease_atomic.delay(1, 4, idempotency_key="w6")
    pid = body_pid("w6")
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(3)  # longer than the lease (lock_ttl=2)
        control().delete("pid:w6")
        tasks.short_lease_atomic.delay(1, 4, idempotency_key="w6")
        done = finished("w6")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(
        lambda: logged(running_workers, f"{tasks.short_lease_atomic.name}[w6] lost its lease (fence 1)"),
        timeout=60,
        what="the paused holder to find its lease lost",
    )
    assert done.fence == 2
    assert list(Effect.objects.filter(key="w6").values_list("fence", flat=True)) == [2]


def test_self_retry_counts_attempts_and_never_blocks_on_its_own_lock(running_workers: list[Worker]) -> None:
    tasks.retrying.delay(2, idempotency_key="retry")
    done = finished("retry")
    assert (done.attempts, done.fence) == (3, 3)
    assert Effect.objects.filter(key="retry").count() == 3
    assert not logged(running_workers, f"{tasks.retrying.name}[retry] is held by another delivery")


def test_autoretry_after_a_failure_runs_again(running_workers: list[Worker]) -> None:
    tasks.autoretrying.delay(1, idempotency_key="autoretry")
    done = finished("autoretry")
    assert (done.attempts, done.result) == (2, {"value": 1, "fence": 2})


def test_conflict_retries_do_not_use_up_max_retries(running_workers: list[Worker]) -> None:
    first = tasks.no_retries.delay(3, idempotency_key="patient")
    body_pid("patient")
    second = tasks.no_retries.delay(3, idempotency_key="patient")
    assert second.get(timeout=90) == first.get(timeout=90) == {"value": 3, "fence": 1, "retries": 0}
    assert logged(running_workers, f"{tasks.no_retries.name}[patient] is held by another delivery")


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
