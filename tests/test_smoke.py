from __future__ import annotations

import pytest

from django_idempotent_tasks.models import IdempotencyRecord
from tests.testapp import tasks
from tests.testapp.models import Effect


@pytest.mark.django_db(transaction=True)
def test_apply_then_replay() -> None:
    first = tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "k1"}).get()
    second = tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "k1"}).get()
    assert first == second == {"value": 1, "fence": 1}
    assert Effect.objects.count() == 1
    assert IdempotencyRecord.objects.get().status == "SUCCEEDED"
