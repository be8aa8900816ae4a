"""pytest fixtures for testing idempotent tasks, loaded through the ``pytest11`` entry point."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from django_idempotent_tasks.testing import Executions


@pytest.fixture
def idempotency_records(db: None) -> Any:
    """The ``IdempotencyRecord`` manager, with database access: filter it by ``key`` in assertions."""
    from django_idempotent_tasks.models import IdempotencyRecord

    return IdempotencyRecord.objects


@pytest.fixture(name="count_executions")
def count_executions_fixture() -> Callable[[Any], AbstractContextManager[Executions]]:
    """``django_idempotent_tasks.testing.count_executions``: ``with count_executions(task) as runs:``."""
    from django_idempotent_tasks.testing import count_executions

    return count_executions
