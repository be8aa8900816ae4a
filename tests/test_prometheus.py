"""The Prometheus recipe: real deliveries move the counters of django_idempotent_tasks.contrib.prometheus."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from django_idempotent_tasks.contrib import prometheus
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import Worker, finished, wait_for
from tests.running import run_task as run
from tests.testapp import functions, tasks

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "observed"
BODY_SLEEP = 1.0  # seconds the body sleeps while another "delivery" takes its lease over


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    prometheus.connect(registry)
    yield registry
    prometheus.disconnect(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"idempotent_tasks_{name}_total", labels) or 0.0


def test_replays_and_conflicts_are_counted(registry: CollectorRegistry) -> None:
    name = tasks.raising_conflict.name
    run(tasks.raising_conflict, 0, key="m-1")
    run(tasks.raising_conflict, 0, key="m-1")
    run(tasks.raising_conflict, 0, key="m-1")
    IdempotencyRecord.objects.filter(key="m-1").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    run(tasks.raising_conflict, 0, key="m-1", propagate=False)
    assert value(registry, "replays", task=name) == 2
    assert value(registry, "conflicts", task=name, action="raise") == 1
    assert "idempotent_tasks_replays_total" in generate_latest(registry).decode()


def test_takeovers_unstorable_results_and_exhausted_keys_are_counted(registry: CollectorRegistry) -> None:
    run(tasks.record_effect, 1, key="m-2")
    IdempotencyRecord.objects.filter(key="m-2").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    run(tasks.record_effect, 1, key="m-2")  # the holder died: this delivery takes over
    run(tasks.unstorable, "object", key="m-3", propagate=False)
    for _ in range(4):  # max_attempts=3: the fourth delivery finds the key failed for good
        run(tasks.failing, 10, key="m-4", propagate=False)
    assert value(registry, "takeovers", task=tasks.record_effect.name) == 1
    assert value(registry, "unstorable_results", task=tasks.unstorable.name) == 1
    assert value(registry, "attempts_exhausted", task=tasks.failing.name) == 1


def test_a_lost_lease_is_counted(registry: CollectorRegistry) -> None:
    def take_over() -> None:
        # Another delivery takes the lease over and finishes while the body sleeps.
        time.sleep(BODY_SLEEP / 2)
        IdempotencyRecord.objects.filter(key="m-5").update(fence=F("fence") + 1, status="SUCCEEDED")
        connection.close()

    thief = threading.Thread(target=take_over)
    thief.start()
    run(tasks.record_effect, 1, BODY_SLEEP, key="m-5")
    thief.join()
    assert value(registry, "lost_leases", task=tasks.record_effect.name) == 1


def test_connect_is_idempotent_and_disconnect_stops_counting(registry: CollectorRegistry) -> None:
    assert prometheus.connect(registry) is prometheus.connect(registry)
    prometheus.disconnect(registry)
    run(tasks.raising_conflict, 0, key="m-6")
    run(tasks.raising_conflict, 0, key="m-6")
    assert value(registry, "replays", task=tasks.raising_conflict.name) == 0
    prometheus.connect(registry)
    run(tasks.raising_conflict, 0, key="m-6")
    assert value(registry, "replays", task=tasks.raising_conflict.name) == 1


def test_deliveries_are_counted_by_outcome(registry: CollectorRegistry) -> None:
    name = tasks.raising_conflict.name
    run(tasks.raising_conflict, 0, key="m-7")
    run(tasks.raising_conflict, 0, key="m-7")
    run(tasks.raising_conflict, 0, key="m-7")
    IdempotencyRecord.objects.filter(key="m-7").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    run(tasks.raising_conflict, 0, key="m-7", propagate=False)
    for _ in range(4):  # max_attempts=3: three failures, then the key is failed for good
        run(tasks.failing, 10, key="m-8", propagate=False)
    outcomes = {
        outcome: value(registry, "deliveries", task=task, outcome=outcome)
        for task, outcome in [
            (name, "completed"),
            (name, "replayed"),
            (name, "conflict"),
            (tasks.failing.name, "failed"),
            (tasks.failing.name, "exhausted"),
        ]
    }
    assert outcomes == {"completed": 1, "replayed": 2, "conflict": 1, "failed": 3, "exhausted": 1}


@pytest.mark.workers
def test_a_prefork_workers_counters_are_served_in_multiprocess_mode(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    # The recipe of docs/observability.md: PROMETHEUS_MULTIPROC_DIR for the worker, counters
    # connected in each child (tests/observed_app.py), one collector reading every child's file.
    worker = Worker(
        "prom",
        {**worker_env, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        app="tests.observed_app",
        extra=("-Q", QUEUE),
    ).start()
    try:
        for n in range(4):  # two children: both end up with deliveries to count
            tasks.record_effect.apply_async((n,), {"idempotency_key": f"prom-{n}"}, queue=QUEUE)
        for n in range(4):
            finished(f"prom-{n}")
        tasks.record_effect.apply_async((0,), {"idempotency_key": "prom-0"}, queue=QUEUE)

        served = CollectorRegistry()
        multiprocess.MultiProcessCollector(served, path=str(tmp_path))  # type: ignore[no-untyped-call]

        def replayed() -> float:
            return value(served, "deliveries", task=tasks.record_effect.name, outcome="replayed")

        wait_for(replayed, what="the worker's replay to be counted")
    finally:
        worker.stop()
    assert value(served, "deliveries", task=tasks.record_effect.name, outcome="completed") == 4
    assert replayed() == 1
    assert len(list(tmp_path.glob("counter_*.db"))) >= 1
    assert "idempotent_tasks_deliveries_total" in generate_latest(served).decode()


def test_a_functions_replays_and_claims_are_counted(registry: CollectorRegistry) -> None:
    name = functions.raising_conflict.idempotent.name
    functions.raising_conflict(0, idempotency_key="m-f")
    functions.raising_conflict(0, idempotency_key="m-f")
    assert value(registry, "replays", task=name) == 1
    assert name == "tests.testapp.functions.raising_conflict"
