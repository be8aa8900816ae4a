"""The plugin's prefixed fixtures work beside a project's own fixtures of the old, short names."""

from __future__ import annotations

from typing import Any

import pytest

from django_idempotent_tasks.models import IdempotencyRecord
from tests.testapp import tasks


@pytest.fixture
def count_executions() -> str:
    """A project's own fixture that happens to share the plugin's old name (it wins, as pytest says)."""
    return "the project's own"


@pytest.fixture
def idempotency_records() -> str:
    return "the project's own too"


@pytest.mark.django_db(transaction=True)
def test_the_prefixed_fixtures_do_not_collide(
    idempotent_tasks_count_executions: Any,
    idempotent_tasks_records: Any,
    count_executions: str,
    idempotency_records: str,
) -> None:
    with idempotent_tasks_count_executions(tasks.charge_order) as runs:
        tasks.charge_order.apply(args=(43,))
        tasks.charge_order.apply(args=(43,))
    assert runs.count == 1
    assert idempotent_tasks_records.get(key="order-43").status == IdempotencyRecord.Status.SUCCEEDED
    assert (count_executions, idempotency_records) == ("the project's own", "the project's own too")
