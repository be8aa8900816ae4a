"""A deploy that adds an optional parameter keeps in-flight messages valid (a real worker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.helpers import Worker, wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.workers
QUEUE = "deploy"
TIMEOUT = 90


@pytest.fixture
def next_release(worker_env: dict[str, str], transactional_db: Any) -> Iterator[Worker]:
    """A worker running the next release of the test app, where ``deployed`` takes ``currency="EUR"``."""
    worker = Worker("deploy", {**worker_env, "IDEMPOTENT_TESTS_DEPLOY": "2"}, extra=("-Q", QUEUE))
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def test_a_redelivery_after_a_deploy_adding_a_defaulted_parameter_runs(next_release: Worker) -> None:
    # The release before the deploy claimed the key and crashed mid-body: its lease ran out.
    fingerprint = tasks.deployed.idempotency_spec.prepare((1,), {"idempotency_key": "in-flight"}).fingerprint
    records.stuck(
        "in-flight", scope=tasks.deployed.name, task_name=tasks.deployed.name, fingerprint=fingerprint
    )
    tasks.deployed.apply_async((1,), {"idempotency_key": "in-flight"}, queue=QUEUE)  # its redelivery
    record: IdempotencyRecord = wait_for(
        lambda: IdempotencyRecord.objects.filter(key="in-flight").exclude(status="IN_PROGRESS").first(),
        timeout=TIMEOUT,
        what="the redelivery to settle",
    )
    assert (record.status, record.result) == ("SUCCEEDED", {"value": "1 EUR", "fence": 2})
    assert Effect.objects.get(key="in-flight").recovered
