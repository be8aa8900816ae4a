"""``@idempotent`` with django.tasks (or its backport): the immediate backend and a real db_worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django_tasks_db.models import DBTaskResult

from django_idempotent_tasks import django_tasks
from django_idempotent_tasks.decorators import idempotent
from django_idempotent_tasks.exceptions import (
    IdempotencyConfigurationError,
    InvalidIdempotencyKey,
    MissingIdempotencyKey,
)
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import ROOT, calls, wait_for
from tests.testapp import functions
from tests.testapp.faults import arm
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)
WORKER_TIMEOUT = 60  # seconds a db_worker may take to start and run the tasks of one test


class DbWorker:
    """A real ``django-admin db_worker`` process of django-tasks-db on the "database" backend."""

    def __init__(self, env: dict[str, str]) -> None:
        self.log = Path(tempfile.mkdtemp(prefix="idem-db-worker-")) / "worker.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "django", "db_worker", "--backend", "database", "--interval", "0.1"]
                + ["--no-startup-delay", "--settings", "tests.settings", "--pythonpath", "."],
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def start_worker(worker_env: dict[str, str]) -> Iterator[Any]:
    started: list[DbWorker] = []

    def start() -> DbWorker:
        started.append(DbWorker(worker_env))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def finished(*results: Any) -> bool:
    return all(DBTaskResult.objects.get(pk=r.id).status in {"SUCCESSFUL", "FAILED"} for r in results)


# The immediate backend


def test_an_enqueued_task_runs_once_per_key_and_replays_its_result() -> None:
    first = functions.send_receipt.enqueue(42)
    second = functions.send_receipt.enqueue(order_id=42)
    assert first.status == second.status == "SUCCESSFUL"
    assert first.return_value == second.return_value == {"value": 42, "fence": 1, "recovered": False}
    assert Effect.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.key, record.task_name) == ("receipt-42", "tests.testapp.functions.send_receipt")


def test_the_key_is_validated_at_enqueue_before_anything_is_stored() -> None:
    with pytest.raises(MissingIdempotencyKey, match="needs an idempotency key"):
        functions.db_receipt.enqueue(1)
    with pytest.raises(InvalidIdempotencyKey, match="control characters"):
        functions.db_receipt.enqueue(1, idempotency_key="bad\nkey")
    with pytest.raises(TypeError, match="do not fit"):
        functions.db_receipt.enqueue(1, 2, 3, idempotency_key="k")
    with pytest.raises(MissingIdempotencyKey):
        asyncio.run(functions.db_receipt.aenqueue(1))
    assert not DBTaskResult.objects.exists()
    assert not IdempotencyRecord.objects.exists()


def test_aenqueue_stores_the_key_with_the_enqueued_task() -> None:
    async def enqueue() -> Any:
        try:
            return await functions.db_receipt.aenqueue(4, idempotency_key="db-4")
        finally:  # the executor thread's connection, or the test database cannot be dropped
            await sync_to_async(connections.close_all)()

    result = asyncio.run(enqueue())
    assert result.kwargs == {"idempotency_key": "db-4"}
    assert DBTaskResult.objects.get(pk=result.id).args_kwargs == {
        "args": [4],
        "kwargs": {"idempotency_key": "db-4"},
    }


def test_a_derived_key_is_stored_with_the_enqueued_task() -> None:
    result = functions.db_receipt.using(priority=1).enqueue(3, idempotency_key="db-3")
    assert result.kwargs == {"idempotency_key": "db-3"}
    assert functions.send_receipt.enqueue(5).kwargs == {"idempotency_key": "receipt-5"}


def test_task_outermost_takes_the_key_from_enqueue_and_checks_it_when_it_runs() -> None:
    good = functions.send_receipt_inner.enqueue(7, idempotency_key="inner-7")
    assert (
        functions.send_receipt_inner.enqueue(7, idempotency_key="inner-7").return_value == good.return_value
    )
    assert Effect.objects.count() == 1
    missing = functions.send_receipt_inner.enqueue(8)  # no key: found only when the body would run
    assert missing.status == "FAILED"
    assert missing.errors[0].exception_class is MissingIdempotencyKey


def test_a_task_that_takes_a_context_is_refused() -> None:
    with pytest.raises(IdempotencyConfigurationError, match="takes_context"):
        idempotent()(functions.task(takes_context=True)(functions.context_task))


def test_only_the_installed_frameworks_task_classes_are_wrapped() -> None:
    assert django_tasks.is_task(functions.send_receipt)
    assert not django_tasks.is_task(functions.record)


# A real worker: django-tasks-db's db_worker


def test_duplicate_enqueues_on_two_workers_run_the_body_once(start_worker: Any) -> None:
    results = [functions.db_receipt.enqueue(11, 1.0, idempotency_key="dup") for _ in range(3)]
    workers = [start_worker(), start_worker()]
    wait_for(lambda: finished(*results), timeout=WORKER_TIMEOUT, what="the workers to run the tasks")
    rows = [DBTaskResult.objects.get(pk=r.id) for r in results]
    assert [row.status for row in rows] == ["SUCCESSFUL"] * 3, workers[0].output()
    assert [row.return_value for row in rows] == [{"value": 11, "fence": 1, "recovered": False}] * 3
    assert Effect.objects.count() == 1
    assert calls("dup") == 1


def test_a_killed_worker_is_taken_over_after_its_lease(start_worker: Any) -> None:
    arm("after_effect", "db-killed")
    lost = functions.db_receipt.enqueue(12, idempotency_key="db-killed")
    first = start_worker()
    wait_for(lambda: first.process.poll() is not None, timeout=WORKER_TIMEOUT, what="the worker to die")
    assert first.process.returncode == -signal.SIGKILL
    assert DBTaskResult.objects.get(pk=lost.id).status == "RUNNING"  # django-tasks-db never frees it
    again = functions.db_receipt.enqueue(12, idempotency_key="db-killed")
    start_worker()
    wait_for(lambda: finished(again), timeout=WORKER_TIMEOUT, what="the second worker to take over")
    assert DBTaskResult.objects.get(pk=again.id).return_value == {"value": 12, "fence": 2, "recovered": True}
    assert [(e.fence, e.recovered) for e in Effect.objects.order_by("pk")] == [(1, False), (2, True)]
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.fence) == ("SUCCEEDED", 2)
