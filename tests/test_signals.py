"""Signals filter by the shared_task that sent them, and their receivers cannot break a delivery."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.db import connection
from django.db.models import F

from django_idempotent_tasks import keys, signals
from django_idempotent_tasks.exceptions import AttemptsExhausted, LeaseLost, TaskInProgress, UnstorableResult
from django_idempotent_tasks.models import IdempotencyRecord
from tests.running import run_task as run
from tests.testapp import functions, tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db


@pytest.fixture
def listen() -> Iterator[Callable[[TaskSignal, Any], list[dict[str, Any]]]]:
    connected: list[tuple[Any, Any, Any]] = []

    def connect(signal: Any, sender: Any, receiver: Any = None) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        def handler(sender: Any, **kwargs: Any) -> None:
            seen.append(kwargs)

        receiver = receiver or handler
        signal.connect(receiver, sender=sender)
        connected.append((signal, receiver, sender))
        return seen

    yield connect
    for signal, receiver, sender in connected:
        signal.disconnect(receiver, sender=sender)


TaskSignal = signals.TaskSignal


def test_every_signal_can_be_filtered_by_its_shared_task(listen: Any, lock_redis: redis.Redis) -> None:
    seen = {
        name: listen(getattr(signals, name), task)
        for name, task in [
            ("task_claimed", tasks.record_effect),
            ("task_completed", tasks.record_effect),
            ("task_replayed", tasks.record_effect),
            ("task_failed", tasks.fails_for_good),
            ("attempts_exhausted", tasks.fails_for_good),
            ("result_unstorable", tasks.unstorable),
            ("lock_conflict", tasks.raising_conflict),
            ("lease_lost", tasks.atomic_raising),
        ]
    }
    elsewhere = listen(signals.task_claimed, tasks.atomic_effect)
    run(tasks.record_effect, 1, key="a")
    run(tasks.record_effect, 1, key="a")
    for _ in range(2):
        with pytest.raises((RuntimeError, AttemptsExhausted)):
            run(tasks.fails_for_good, 1, key="b")
    with pytest.raises(UnstorableResult):
        run(tasks.unstorable, "object", key="c")
    lock_redis.set(keys.lock_name(tasks.raising_conflict.name, "d"), "another delivery", px=60_000)
    with pytest.raises(TaskInProgress):
        run(tasks.raising_conflict, 0, key="d")

    def take_over(sender: Any, **kwargs: Any) -> None:
        IdempotencyRecord.objects.filter(key=kwargs["key"]).update(fence=F("fence") + 1)

    listen(signals.task_claimed, tasks.atomic_raising, take_over)
    with pytest.raises(LeaseLost):
        run(tasks.atomic_raising, 1, key="e")
    assert {name: [event["key"] for event in events] for name, events in seen.items()} == {
        "task_claimed": ["a"],
        "task_completed": ["a"],
        "task_replayed": ["a"],
        "task_failed": ["b"],
        "attempts_exhausted": ["b"],
        "result_unstorable": ["c"],
        "lock_conflict": ["d"],
        "lease_lost": ["e"],
    }
    assert elsewhere == []


@pytest.mark.parametrize("by_task", [False, True])
@pytest.mark.parametrize("name", ["task_claimed", "task_completed", "task_replayed"])
def test_a_receiver_that_raises_changes_nothing(listen: Any, name: str, by_task: bool) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a broken receiver")

    listen(getattr(signals, name), tasks.record_effect if by_task else None, broken)
    assert run(tasks.record_effect, 1, key="robust") == {"value": 1, "fence": 1}
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.result) == ("SUCCEEDED", {"value": 1, "fence": 1})
    assert run(tasks.record_effect, 1, key="robust") == {"value": 1, "fence": 1}
    assert Effect.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_task_completed_of_an_atomic_task_fires_after_the_commit(listen: Any) -> None:
    in_transaction: list[bool] = []

    def completed(sender: Any, **kwargs: Any) -> None:
        in_transaction.append(connection.in_atomic_block)

    listen(signals.task_completed, tasks.atomic_effect, completed)
    listen(signals.task_completed, tasks.record_effect, completed)
    run(tasks.atomic_effect, 1, key="atomic")
    run(tasks.record_effect, 1, key="plain")
    assert in_transaction == [False, False]


@pytest.mark.django_db(transaction=True)
def test_a_receiver_filtered_by_an_idempotent_function_hears_its_deliveries() -> None:
    heard: list[str] = []

    def on_replayed(sender: Any, key: str, **kwargs: Any) -> None:
        heard.append(f"{sender.name}:{key}")

    signals.task_replayed.connect(on_replayed, sender=functions.record)
    try:
        functions.record(3, idempotency_key="filtered")
        functions.record(3, idempotency_key="filtered")
        functions.charge(1, 100)
        functions.charge(1, 100)  # another function's replay: not heard
    finally:
        signals.task_replayed.disconnect(on_replayed, sender=functions.record)
    assert heard == ["tests.testapp.functions.record:filtered"]
