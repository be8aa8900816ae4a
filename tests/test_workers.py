"""The guarantee with real ``celery worker -P prefork`` processes: 2 workers x 2 children."""

from __future__ import annotations

import pytest

from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import Worker
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.workers


def succeeded(key: str) -> IdempotencyRecord | None:
    return IdempotencyRecord.objects.filter(key=key, status="SUCCEEDED").first()


def test_concurrent_deliveries_run_the_body_once(running_workers: list[Worker]) -> None:
    results = [tasks.concurrent_effect.delay(7, idempotency_key="burst") for _ in range(20)]
    answers = [result.get(timeout=90) for result in results]
    assert answers == [{"value": 7, "fence": 1}] * 20
    assert Effect.objects.filter(key="burst").count() == 1
    assert succeeded("burst") is not None
