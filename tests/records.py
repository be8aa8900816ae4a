"""Records written straight to the table, in the states the operator commands deal with."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.utils import timezone

from django_idempotent_tasks.models import IdempotencyRecord

PAST = datetime(2020, 1, 1, tzinfo=dt_timezone.utc)
FUTURE = datetime(2999, 1, 1, tzinfo=dt_timezone.utc)


def make(key: str, status: str = "SUCCEEDED", **fields: Any) -> IdempotencyRecord:
    """A record of ``key`` (scope "s", task "tests.task" unless given), not expired by default."""
    values: dict[str, Any] = {
        "scope": "s",
        "task_name": "tests.task",
        "fingerprint": "f" * 64,
        "expires_at": timezone.now() + timedelta(days=1),
    }
    values.update(fields)
    return IdempotencyRecord.objects.create(key=key, status=status, **values)


def expired(key: str, status: str = "SUCCEEDED", **fields: Any) -> IdempotencyRecord:
    return make(key, status, expires_at=PAST, **fields)


def live(key: str, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS with a lease that runs until 2999."""
    return make(key, "IN_PROGRESS", lease_expires_at=FUTURE, worker="host:1", **fields)


def stuck(key: str, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS with a lease that ran out in 2020."""
    return make(key, "IN_PROGRESS", lease_expires_at=PAST, worker="host:1", **fields)


def keys() -> list[str]:
    return sorted(IdempotencyRecord.objects.values_list("key", flat=True))
