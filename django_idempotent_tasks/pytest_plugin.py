"""pytest fixtures for testing idempotent tasks, loaded through the ``pytest11`` entry point.

Their names carry the ``idempotent_tasks_`` prefix so that they cannot collide with a project's own
fixtures; ``idempotency_records`` and ``count_executions`` are the names of 0.1 and still work.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from django_idempotent_tasks.testing import Executions


@pytest.fixture
def idempotent_tasks_records(db: None) -> Any:
    """The ``IdempotencyRecord`` manager, with database access: filter it by ``key`` in assertions."""
    from django_idempotent_tasks.models import IdempotencyRecord

    return IdempotencyRecord.objects


@pytest.fixture
def idempotent_tasks_count_executions() -> Callable[[Any], AbstractContextManager[Executions]]:
    """``django_idempotent_tasks.testing.count_executions``: ``with count_executions(task) as runs:``."""
    from django_idempotent_tasks.testing import count_executions

    return count_executions


@pytest.fixture
def idempotency_records(idempotent_tasks_records: Any) -> Any:
    """The old name of ``idempotent_tasks_records``."""
    return idempotent_tasks_records


@pytest.fixture(name="count_executions")
def count_executions_fixture(
    idempotent_tasks_count_executions: Callable[[Any], AbstractContextManager[Executions]],
) -> Callable[[Any], AbstractContextManager[Executions]]:
    """The old name of ``idempotent_tasks_count_executions``."""
    return idempotent_tasks_count_executions
