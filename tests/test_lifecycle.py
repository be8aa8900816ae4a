"""The lifecycle in-process (apply() and direct calls) against real PostgreSQL and Redis."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.db.models import F
from django.utils import timezone

from django_idempotent_tasks import signals
from django_idempotent_tasks.exceptions import (
    AttemptsExhausted,
    IdempotencyKeyMismatch,
    LeaseLost,
    TaskInProgress,
    UnstorableResult,
)
from django_idempotent_tasks.heartbeat import Heartbeat
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import calls, redis_down
from tests.running import run_task as run
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def error_of(record: IdempotencyRecord) -> dict[str, Any]:
    assert record.error is not None
    return dict(record.error)


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every signal of the app sent during the test, in order."""
    seen: list[tuple[str, dict[str, Any]]] = []
    names = [
        "task_claimed",
        "task_completed",
        "task_replayed",
        "task_failed",
        "lock_conflict",
        "lease_lost",
        "attempts_exhausted",
        "result_unstorable",
    ]
    handlers = {}
    for name in names:

        def handler(sender: Any, name: str = name, **kwargs: Any) -> None:
            seen.append((name, kwargs))

        handlers[name] = handler
        getattr(signals, name).connect(handler)
    yield seen
    for name in names:
        getattr(signals, name).disconnect(handlers[name])


def test_replay_returns_the_stored_result_without_the_body_or_redis(received: list[Any]) -> None:
    first = run(tasks.record_effect, 1, key="replay")
    with redis_down():
        again = run(tasks.record_effect, 1, key="replay")
    assert again == first == {"value": 1, "fence": 1}
    assert Effect.objects.count() == 1
    assert [name for name, _ in received] == ["task_claimed", "task_completed", "task_replayed"]


def test_direct_calls_keep_the_guarantee() -> None:
    assert tasks.record_effect(5, idempotency_key="direct") == {"value": 5, "fence": 1}
    assert tasks.record_effect(5, idempotency_key="direct") == {"value": 5, "fence": 1}
    assert Effect.objects.count() == 1


def test_same_key_other_arguments_is_a_mismatch_and_changes_nothing(caplog: Any) -> None:
    run(tasks.record_effect, 1, key="mismatch")
    before = IdempotencyRecord.objects.values().get()
    with pytest.raises(IdempotencyKeyMismatch, match="used before with different arguments"):
        run(tasks.record_effect, 2, key="mismatch")
    assert IdempotencyRecord.objects.values().get() == before
    assert Effect.objects.count() == 1
    assert "mismatch" in [getattr(record, "idempotency_outcome", None) for record in caplog.records]


def test_positional_and_keyword_forms_of_one_call_are_the_same_work() -> None:
    run(tasks.record_effect, 1, key="forms")
    assert tasks.record_effect.apply(kwargs={"value": 1, "idempotency_key": "forms"}).get()["value"] == 1
    assert Effect.objects.count() == 1


def test_keys_are_scoped_per_task_unless_a_scope_is_shared() -> None:
    run(tasks.record_effect, 1, key="k")
    run(tasks.atomic_effect, 1, key="k")
    run(tasks.shared_scope_a, 1, key="k")
    assert run(tasks.shared_scope_b, 1, key="k") == {"value": 1, "fence": 1}
    assert Effect.objects.count() == 3
    assert set(IdempotencyRecord.objects.values_list("scope", flat=True)) == {
        "tests.testapp.tasks.record_effect",
        "tests.testapp.tasks.atomic_effect",
        "shared",
    }


def test_body_receives_the_key_only_if_it_accepts_it() -> None:
    assert run(tasks.takes_key, 1, key="given") == "given"


def test_failure_is_recorded_and_the_next_delivery_runs_again(received: list[Any]) -> None:
    with pytest.raises(RuntimeError, match="attempt 1 fails"):
        run(tasks.failing, 1, key="fail-once")
    record = IdempotencyRecord.objects.get()
    assert (record.status, error_of(record)["type"], error_of(record)["message"]) == (
        "FAILED",
        "RuntimeError",
        "attempt 1 fails",
    )
    assert "Traceback" in error_of(record)["traceback"]
    assert run(tasks.failing, 1, key="fail-once") == {"value": 1, "fence": 2}
    record.refresh_from_db()
    assert (record.status, record.attempts, record.fence) == ("SUCCEEDED", 2, 2)
    assert "task_failed" in [name for name, _ in received]


def test_attempts_exhausted_fails_the_key_for_good(received: list[Any]) -> None:
    for attempt in (1, 2, 3):
        with pytest.raises(RuntimeError, match=f"attempt {attempt} fails"):
            run(tasks.failing, 10, key="poison")
    with pytest.raises(AttemptsExhausted, match=r"after 3 attempts \(max_attempts=3\)"):
        run(tasks.failing, 10, key="poison")
    with pytest.raises(AttemptsExhausted):
        run(tasks.failing, 10, key="poison")
    assert Effect.objects.count() == 3
    record = IdempotencyRecord.objects.get()
    assert (record.status, error_of(record)["type"]) == ("FAILED", "AttemptsExhausted")
    assert [kw["attempts"] for name, kw in received if name == "attempts_exhausted"] == [3, 3]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("object", "not JSON serializable"), ("large", "over IDEMPOTENT_TASKS_MAX_RESULT_BYTES")],
)
def test_unstorable_results_still_mark_the_key_done(kind: str, reason: str, caplog: Any) -> None:
    with caplog.at_level(logging.ERROR, logger="django_idempotent_tasks"), pytest.raises(UnstorableResult):
        run(tasks.unstorable, kind, key=f"u-{kind}")  # an eager run says so; a worker logs it
    assert run(tasks.unstorable, kind, key=f"u-{kind}") is None
    assert Effect.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.status, error_of(record)["type"]) == ("SUCCEEDED", "UnstorableResult")
    assert reason in error_of(record)["message"]
    assert "unstorable" in [getattr(line, "idempotency_outcome", None) for line in caplog.records]


def stale_record(task: Any, key: str, args: tuple[Any, ...], lease: timedelta) -> IdempotencyRecord:
    """An IN_PROGRESS record as a crashed (or still running) holder leaves it."""
    call = task.idempotency_spec.prepare(args, {"idempotency_key": key})
    now = timezone.now()
    return IdempotencyRecord.objects.create(
        scope=task.idempotency_spec.scope,
        key=key,
        task_name=task.name,
        fingerprint=call.fingerprint,
        worker="gone:1",
        task_id="old",
        started_at=now - timedelta(minutes=5),
        lease_expires_at=now + lease,
        expires_at=now + timedelta(days=1),
    )


def test_a_stale_in_progress_record_is_taken_over_once(received: list[Any]) -> None:
    stale_record(tasks.record_effect, "stale", (1,), timedelta(seconds=-30))
    assert run(tasks.record_effect, 1, key="stale") == {"value": 1, "fence": 2}
    assert run(tasks.record_effect, 1, key="stale") == {"value": 1, "fence": 2}
    effect = Effect.objects.get()
    assert (effect.fence, effect.recovered) == (2, True)
    [claimed] = [kw for name, kw in received if name == "task_claimed"]
    assert (claimed["fence"], claimed["recovered"]) == (2, True)


def test_a_live_lease_raises_task_in_progress_when_asked_to(received: list[Any]) -> None:
    stale_record(tasks.raising_conflict, "busy", (0,), timedelta(seconds=30))
    with pytest.raises(TaskInProgress, match="being executed by another delivery"):
        run(tasks.raising_conflict, 0, key="busy")
    assert Effect.objects.count() == 0
    assert [kw["action"] for name, kw in received if name == "lock_conflict"] == ["raise"]


def test_wait_blocks_until_the_holders_lease_expires_then_takes_over() -> None:
    stale_record(tasks.waiting_conflict, "waits", (0,), timedelta(seconds=1))
    assert run(tasks.waiting_conflict, 0, key="waits") == {"value": 0, "fence": 2}


def test_wait_replays_when_the_holder_finishes() -> None:
    record = stale_record(tasks.waiting_conflict, "finishes", (0,), timedelta(seconds=30))

    def holder_finishes() -> None:
        IdempotencyRecord.objects.filter(pk=record.pk).update(status="SUCCEEDED", result={"from": "holder"})
        connection.close()

    timer = threading.Timer(0.5, holder_finishes)
    timer.start()
    try:
        assert run(tasks.waiting_conflict, 0, key="finishes") == {"from": "holder"}
    finally:
        timer.join()
    assert Effect.objects.count() == 0


def test_64_threads_applying_one_key_run_the_body_once(connection_crowd: None) -> None:
    answers: list[Any] = []
    barrier = threading.Barrier(64)

    def deliver() -> None:
        barrier.wait()
        try:
            answers.append(run(tasks.concurrent_effect, 9, 0.3, key="threads"))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert answers == [{"value": 9, "fence": 1}] * 64
    assert Effect.objects.count() == 1


def test_eager_retry_runs_again_without_blocking_on_its_own_lock() -> None:
    assert run(tasks.retrying, 2, key="eager-retry") == {"value": 2, "fence": 3}
    assert Effect.objects.count() == 3
    assert IdempotencyRecord.objects.get().attempts == 3


def test_a_wait_gives_up_after_the_lock_ttl_while_the_holders_lease_lives() -> None:
    stale_record(tasks.impatient_wait, "held", (0,), timedelta(seconds=30))  # a holder still renewing
    with pytest.raises(TaskInProgress, match="still held by another delivery after waiting 1 s"):
        run(tasks.impatient_wait, 0, key="held")
    record = IdempotencyRecord.objects.get()
    assert (record.task_id, record.fence, record.status) == ("old", 1, "IN_PROGRESS")
    assert Effect.objects.count() == 0


@contextlib.contextmanager
def taken_over_while_running(renewing: bool = False) -> Iterator[None]:
    """Another delivery takes the key over (the fence moves) while the delivery inside runs its body;
    ``renewing``: the taker's lease lives on for 30 s more, as a holder that renews it keeps it."""

    def take_over(sender: Any, **kwargs: Any) -> None:
        lease = {"lease_expires_at": timezone.now() + timedelta(seconds=30)} if renewing else {}
        IdempotencyRecord.objects.filter(key=kwargs["key"]).update(fence=F("fence") + 1, **lease)

    signals.task_claimed.connect(take_over)
    try:
        yield
    finally:
        signals.task_claimed.disconnect(take_over)


def test_atomic_body_rolls_back_when_the_fence_moved(received: list[Any]) -> None:
    with taken_over_while_running(), pytest.raises(LeaseLost, match=r"lost its lease \(fence 1\)"):
        run(tasks.atomic_raising, 1, key="fenced")
    assert Effect.objects.count() == 0  # the body's write rolled back with the refused completion
    assert "lease_lost" in [name for name, _ in received]
    assert IdempotencyRecord.objects.get().status == "IN_PROGRESS"


def test_a_completion_refused_after_a_take_over_raises_lease_lost_with_on_conflict_raise(
    received: list[Any],
) -> None:
    match = r"lost its lease \(fence 1\) to another delivery"
    with taken_over_while_running(), pytest.raises(LeaseLost, match=match):
        run(tasks.raising_conflict, 0, key="fenced-raise")
    # The body ran (its effect is not transactional); its result was not written over the taker's.
    assert Effect.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.fence, record.result) == ("IN_PROGRESS", 2, None)
    assert [name for name, _ in received].count("lease_lost") == 1


def test_a_failure_after_the_key_was_taken_over_leaves_the_new_holders_record(
    received: list[Any], caplog: Any
) -> None:
    with taken_over_while_running(), pytest.raises(RuntimeError, match="attempt 1 fails"):
        run(tasks.failing, 1, key="fenced-failure")
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.fence, record.error) == ("IN_PROGRESS", 2, None)
    assert "task_failed" not in [name for name, _ in received]
    assert "failed with RuntimeError('attempt 1 fails') after losing its lease" in caplog.text


def test_a_holder_that_lost_its_key_to_a_live_taker_waits_and_gives_up_without_running_again(
    received: list[Any],
) -> None:
    # on_conflict="wait": the refused completion finds the taker still running (no result to
    # replay), so the delivery waits like any other for a held key, takes nothing over while the
    # taker's lease lives, and gives up after lock_ttl (1 s).
    with (
        taken_over_while_running(renewing=True),
        pytest.raises(TaskInProgress, match="still held by another delivery after waiting 1 s"),
    ):
        run(tasks.impatient_wait, 0, key="lost-to-a-live-taker")
    assert Effect.objects.count() == 1  # its own run, never a second one
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.fence, record.result) == ("IN_PROGRESS", 2, None)
    names = [name for name, _ in received]
    assert (names.count("task_claimed"), names.count("lease_lost")) == (1, 1)
    assert names.count("lock_conflict") >= 1


def test_a_lease_lost_by_an_idempotent_call_inside_the_body_is_the_bodys_error(received: list[Any]) -> None:
    # The inner call (on_conflict="raise") lost its own key and raised LeaseLost; the outer delivery
    # still holds its lease: it records the failure, never takes its own key over to run again.
    with pytest.raises(LeaseLost, match="to another delivery"):
        run(tasks.calls_a_key_taken_over, key="outer")
    assert calls("outer") == 1
    outer = IdempotencyRecord.objects.get(key="outer")
    assert (outer.status, outer.fence, error_of(outer)["type"]) == ("FAILED", 1, "LeaseLost")
    names = [name for name, _ in received]
    assert (names.count("lease_lost"), names.count("task_failed")) == (1, 1)  # the inner's, the outer's


def test_redis_down_on_acquire_falls_back_to_the_database_lease_in_eager_mode(caplog: Any) -> None:
    with redis_down():
        assert run(tasks.record_effect, 3, key="no-redis") == {"value": 3, "fence": 1}
    assert "could not ask Redis for its lock" in caplog.text
    assert Effect.objects.count() == 1


def test_a_take_over_renews_the_records_retention() -> None:
    record = stale_record(tasks.record_effect, "old", (1,), timedelta(seconds=-30))
    IdempotencyRecord.objects.filter(pk=record.pk).update(expires_at=timezone.now() - timedelta(days=1))
    run(tasks.record_effect, 1, key="old")
    expires_at = IdempotencyRecord.objects.get().expires_at
    assert expires_at is not None and expires_at > timezone.now() + timedelta(days=6)
    assert not IdempotencyRecord.objects.expired().exists()


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (tasks.deadlocks, "deadlock detected"),
        # The server cancels its statement on the connection the body opened again: still its own.
        (tasks.times_out_after_reconnecting, "statement timeout|max_statement_time"),
    ],
    ids=["deadlock", "timeout after reconnecting"],
)
def test_the_bodys_own_operational_error_is_its_own_in_eager_mode(task: Any, message: str) -> None:
    # An error on a working connection: the task's autoretry (max_retries=1) runs it again, then
    # it fails with the body's error, never taken for a lost connection (the key left IN_PROGRESS).
    if task is tasks.times_out_after_reconnecting and connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to cancel a statement")
    with pytest.raises(OperationalError, match=message):
        run(task, key="eager-own-error")
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.attempts, error_of(record)["type"]) == ("FAILED", 2, "OperationalError")
    assert calls("eager-own-error") == 2


def heartbeats() -> int:
    gc.collect()
    return sum(isinstance(found, Heartbeat) for found in gc.get_objects())


def test_finished_deliveries_leave_no_heartbeat_behind() -> None:
    before = heartbeats()  # earlier tests' long bodies may still be ending theirs
    for number in range(20):
        run(tasks.record_effect, number, key=f"no-leak-{number}")
    assert heartbeats() <= before
